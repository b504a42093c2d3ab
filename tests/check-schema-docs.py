#!/usr/bin/env python3
"""Fails when the docs disagree with the code about the schema version.

check-schema-docs.py SOURCE_ROOT

The code's current version is DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN in
dispatcher/db/db_claim_sql.h (the build's embed.py already checks that sql/schema.sql
and the migrations agree with it); the code's migrations are sql/migrations/NNN-name.sql
(their NAME is what `taskpushd --migrate` prints). Checked:

- every sentence of the docs (README.md, docs/*.md but the dated journal, man/*.in,
  packaging/README.md, python/README.md) that names the *current* version names the
  code's: "(now N)" after schema_version, "schema version N is current", "this
  taskpushd (N)", "this taskpushd knows (N)", "created schema version N", "knows 1 to
  N", "the current (or latest) schema version N"; the examples of older/newer versions in the messages
  are older/newer than it;
- every `schema A -> B: NAME` line (--migrate's output) is a real migration: B = A + 1,
  B a migration of the code, NAME its name; and a run of such lines ends at the current
  version, as --migrate does;
- the migration table of docs/schema.md ("| version | file | change |") lists exactly
  version 1 and the code's migrations, each with its file.

Each problem is printed as FILE:LINE: what; the exit status is 1 if there is any.
"""
import glob
import os
import re
import sys


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: check-schema-docs.py SOURCE_ROOT\n")
        return 2
    root = argv[1]
    problems = []

    def problem(path, text, pos, what):
        problems.append("%s:%d: %s" % (os.path.relpath(path, root), line_of(text, pos), what))

    header = os.path.join(root, "dispatcher/db/db_claim_sql.h")
    with open(header, encoding="utf-8") as f:
        m = re.search(r"#define\s+DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN\s+(\d+)", f.read())
    if not m:
        print("%s: no DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN" % os.path.relpath(header, root))
        return 1
    current = int(m.group(1))

    migrations = {}  # version -> (file name, name)
    for p in sorted(glob.glob(os.path.join(root, "sql/migrations/*.sql"))):
        m = re.fullmatch(r"(\d{3})-([a-z0-9]+(?:-[a-z0-9]+)*)\.sql", os.path.basename(p))
        if m:
            migrations[int(m.group(1))] = (os.path.basename(p), m.group(2).replace("-", " "))
    if sorted(migrations) != list(range(2, current + 1)):
        print("sql/migrations/ holds versions %s, but the code's current version is %d"
              % (sorted(migrations), current))
        return 1

    docs = [os.path.join(root, "README.md"), os.path.join(root, "packaging/README.md"),
            os.path.join(root, "python/README.md")]
    docs += sorted(glob.glob(os.path.join(root, "docs/*.md")))
    docs += sorted(glob.glob(os.path.join(root, "man/*.in")))
    # Phrases that name the current version; [^.\n]{0,80} keeps each to one sentence.
    names_current = [
        r"schema[_ ]version\b[^.\n]{0,80}?\(now (\d+)\)",
        r"schema[_ ]version\b[^.\n]{0,80}?\bis now (\d+)",
        r"schema version (\d+) is current",
        r"than this taskpushd \((\d+)\)",
        r"than this taskpushd knows \((\d+)\)",
        r"created schema version (\d+)",
        r"this one knows 1 to (\d+)",
        r"(?:current|latest) (?:schema )?version[ (]+(?:schema_version |is )?(\d+)",
    ]
    checked = 0
    for path in docs:
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        # groff escapes the hyphen; the docs' sentences are compared as text.
        text = text.replace("\\-", "-")
        for pat in names_current:
            for m in re.finditer(pat, text, re.IGNORECASE):
                checked += 1
                if int(m.group(1)) != current:
                    problem(path, text, m.start(),
                            "names schema version %s as current ('%s'); the code's is %d"
                            % (m.group(1), m.group(0), current))
        for m in re.finditer(r"schema version (\d+) is older than", text):
            checked += 1
            if int(m.group(1)) >= current:
                problem(path, text, m.start(), "'%s': %s is not older than the current %d"
                        % (m.group(0), m.group(1), current))
        for m in re.finditer(r"schema version (\d+) is newer than", text):
            checked += 1
            if int(m.group(1)) <= current:
                problem(path, text, m.start(), "'%s': %s is not newer than the current %d"
                        % (m.group(0), m.group(1), current))
        run_end = None  # (line, B, pos) of the last line of a run of `schema A -> B` lines
        for m in re.finditer(r"schema (\d+) -> (\d+): ([a-z0-9 ]+)", text):
            checked += 1
            ln = line_of(text, m.start())
            if run_end and run_end[0] != ln - 1 and run_end[1] != current:
                problem(path, text, run_end[2], "a --migrate run that ends at schema %d: "
                        "--migrate always goes on to the current %d" % (run_end[1], current))
            run_end = (ln, int(m.group(2)), m.start())
            a, b, name = int(m.group(1)), int(m.group(2)), m.group(3).strip()
            if b != a + 1 or b not in migrations or migrations[b][1] != name:
                want = ("schema %d -> %d: %s" % (b - 1, b, migrations[b][1])
                        if b in migrations else "no migration %d" % b)
                problem(path, text, m.start(), "'%s' is not what --migrate prints (%s)"
                        % (m.group(0), want))
        if run_end and run_end[1] != current:
            problem(path, text, run_end[2], "a --migrate run that ends at schema %d: "
                    "--migrate always goes on to the current %d" % (run_end[1], current))

    # docs/schema.md's table of versions: version 1, then one row per migration.
    path = os.path.join(root, "docs/schema.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    t = text.find("| version | file | change |")
    if t < 0:
        problem(path, text, 0, "no table '| version | file | change |' of the migrations")
    else:
        rows = {}
        for m in re.finditer(r"^\| *(\d+) *\| *(?:`sql/migrations/([^`]*)`)? *\|", text[t:], re.M):
            rows[int(m.group(1))] = (m.group(2) or "", t + m.start())
            if text[t + m.end():].startswith("\n\n"):
                break
        want = {1: ""}
        want.update({v: f for v, (f, _) in migrations.items()})
        for v in sorted(set(rows) | set(want)):
            if v not in rows:
                problem(path, text, t, "the table of versions lacks version %d (%s)"
                        % (v, want[v] or "the first schema"))
            elif v not in want:
                problem(path, text, rows[v][1], "the table of versions lists version %d, "
                        "which the code does not have (current: %d)" % (v, current))
            elif rows[v][0] != want[v]:
                problem(path, text, rows[v][1], "version %d's file is '%s', not '%s'"
                        % (v, rows[v][0], want[v]))
            checked += 1

    def where(p):
        f, ln, _ = p.split(":", 2)
        return (f, int(ln))

    for p in sorted(problems, key=where):
        print(p)
    if problems:
        print("%d problem(s): the docs name another schema version than the code's (%d)"
              % (len(problems), current))
        return 1
    print("schema version %d and migrations 2..%d: %d mentions in the docs agree with the code"
          % (current, current, checked))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
