#!/bin/sh
# Builds the Java library of taskpush with the JDK alone (javac, jar; no Gradle or Maven):
#
#   clients/java/build.sh OUT          OUT/taskpush.jar (the library, no dependency)
#   clients/java/build.sh OUT --test   also OUT/test-classes (the test runner and tests)
#
# JDK 17 (Debian's openjdk-17-jdk-headless). Warnings are errors.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT [--test]}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/classes" "$out/test-classes"
mkdir -p "$out/classes"
find "$here/src/main/java" -name '*.java' | sort > "$out/main-sources"
javac --release 17 -Xlint:all -Werror -encoding UTF-8 -d "$out/classes" @"$out/main-sources"
jar --create --file "$out/taskpush.jar" -C "$out/classes" .
if [ "${2:-}" = "--test" ]; then
    mkdir -p "$out/test-classes"
    find "$here/src/test/java" -name '*.java' | sort > "$out/test-sources"
    javac --release 17 -Xlint:all -Werror -encoding UTF-8 -cp "$out/classes" -d "$out/test-classes" @"$out/test-sources"
fi
