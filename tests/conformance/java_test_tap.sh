#!/bin/sh
# java_test_tap.sh SOURCE_ROOT BUILD_ROOT: builds the Java library (clients/java/build.sh,
# output in BUILD_ROOT/clients-java) and runs its tests, which print TAP: the codec against
# the golden frames, and the worker and client against the build's taskpushd and the private
# MariaDB of scripts/tp-mariadb's environment. A missing JDK fails (scripts/install-deps.sh
# --test installs openjdk-17-jdk-headless).
set -u
src=$1
build=$2
if ! command -v javac >/dev/null 2>&1 || ! command -v java >/dev/null 2>&1; then
    echo "not ok 1 - javac is not installed (scripts/install-deps.sh --test installs openjdk-17-jdk-headless)"
    echo "1..1"
    exit 1
fi
out=$build/clients-java
if ! log=$("$src/clients/java/build.sh" "$out" --test 2>&1); then
    echo "not ok 1 - clients/java/build.sh"
    printf '%s\n' "$log" | sed 's/^/# /'
    echo "1..1"
    exit 1
fi
export TASKPUSH_SOURCE_ROOT="$src" TASKPUSH_BUILD_ROOT="$build"
# Small heaps: two JVMs (gcc and ASan builds) share 2 cores in CI.
exec java -Xss512k -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.io.tmpdir="$out" \
    -cp "$out/classes:$out/test-classes" dev.taskpush.TapRunner -j 4 \
    dev.taskpush.wire.WireTest ${TASKPUSH_JAVA_TESTS:-dev.taskpush.DocsTest dev.taskpush.HostileTest dev.taskpush.IntegrationTest}
