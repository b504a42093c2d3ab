#!/usr/bin/env python3
r"""check-layering.py: fails when the #include "..." graph of the C sources breaks a rule.

Usage: check-layering.py [--root DIR] [--include-dir DIR]... RULE...
  --no-cycles FOLDER      the modules of FOLDER (and its subfolders) include each other
                          in no circle
  --forbid FOLDER:Y[,Y]   no file of FOLDER (or its subfolders) includes a file that
                          lies directly in Y (a subfolder of Y is not Y)
  --own-headers FOLDER    each header of FOLDER declares only functions of its own
                          module (X.h those of X.c; a header with no .c of its name,
                          none that a .c of FOLDER defines): a function declared in
                          another module's header is called without an include of
                          its own, where --no-cycles cannot see it
  --api-header FILE       a public header, which --own-headers lets declare the
                          functions of any file (worker-client/taskpush.h)
  --root DIR              the source tree the paths are relative to (default: the
                          parent of this script's folder)
  --include-dir DIR       where a quoted include not found beside its file is looked
                          for, in order, as the compiler's -iquote/-I (default: none)

A module is a .c file and the .h of the same name in the same folder (client.c and
client.h); module A depends on module B when a file of A includes a file of B. A
quoted include is looked for beside the including file, then in the --include-dir
folders, then among the files under the rule's folders by name; a name that two of
those files bear is an error (say which with --include-dir), so that no include goes
unread. Includes in angle brackets, and those of files outside the tree, are not
part of the graph.

Exit status: 0 when every rule holds, 1 when one is broken (each breach printed),
2 on a usage error or an include that cannot be placed.
Example: check-layering.py --no-cycles worker-client \
           --forbid dispatcher/db:dispatcher --forbid dispatcher/common:dispatcher,dispatcher/db
"""
import argparse
import os
import re
import sys

SOURCE_SUFFIXES = (".c", ".h")
INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.MULTILINE)


class LayeringError(Exception):
    """An include the checker cannot place, or a rule naming a missing folder (exit 2)."""


def strip_comments(text):
    """text with its comments blanked (newlines kept, so line numbers hold); string
    and character literals are kept, so that a "/*" inside one opens no comment."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:end]))
            i = end
        elif c == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def quoted_includes(path):
    """[(line number, name)] of the #include "name" lines of a file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip_comments(f.read())
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in INCLUDE_RE.finditer(text)]


def blank_literals(text):
    """text (comments already blanked) with the insides of string and character
    literals blanked, so that no brace or semicolon in one is read as code."""
    return re.sub(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'',
                  lambda m: m.group(0)[0] + " " * (len(m.group(0)) - 2) + m.group(0)[0], text)


def without_preprocessor(text):
    """text without its preprocessor lines (a macro's continued lines too) and without
    what #ifdef __cplusplus guards (extern "C" {, whose brace would hide the rest)."""
    out, skip_depth, depth = [], None, 0
    lines = iter(text.split("\n"))
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            while line.endswith("\\"):
                line = next(lines, "")
            word = re.match(r"#\s*(\w*)", stripped).group(1)
            if word in ("if", "ifdef", "ifndef"):
                depth += 1
                if skip_depth is None and "__cplusplus" in stripped:
                    skip_depth = depth
            elif word == "endif":
                if skip_depth == depth:
                    skip_depth = None
                depth -= 1
            out.append("")
        else:
            out.append("" if skip_depth is not None else line)
    return "\n".join(out)


def top_level_functions(path):
    """(declared, defined): the names of the functions that a file declares and those
    it defines at file scope, static ones left out (no other file can call them)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = without_preprocessor(blank_literals(strip_comments(f.read())))
    declared, defined = set(), set()
    depth, chunk = 0, []
    for c in text:
        if depth == 0 and c in ";{":
            head = " ".join("".join(chunk).split())
            head = re.sub(r"__attribute__\s*\(\(.*?\)\)", "", head)  # names no function
            chunk = []
            name = re.search(r"(\w+)\s*\(", head)
            plain = (name is not None and "=" not in head
                     and not re.match(r"(typedef|struct|union|enum)\b", head)
                     and not re.search(r"\bstatic\b", head))
            if plain and c == ";":
                declared.add(name.group(1))
            elif plain and head.endswith(")"):
                defined.add(name.group(1))
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                chunk = []
        elif depth == 0 and c != ";":
            chunk.append(c)
    return declared, defined


def module_of(relpath):
    """The module of a source file: its path without the suffix (x/client.c, x/client.h
    -> x/client)."""
    return os.path.splitext(relpath)[0]


class Tree:
    """The C sources of a tree, paths relative to its root with '/' separators."""

    def __init__(self, root, include_dirs=()):
        self.root = os.path.abspath(root)
        self.include_dirs = [self.norm(d) for d in include_dirs]
        self._includes = {}

    @staticmethod
    def norm(path):
        path = os.path.normpath(path).replace(os.sep, "/")
        return "" if path == "." else path

    def exists(self, rel):
        return os.path.isfile(os.path.join(self.root, rel))

    def folder(self, rel):
        rel = self.norm(rel)
        if not os.path.isdir(os.path.join(self.root, rel)):
            raise LayeringError(f"no folder {rel!r} under {self.root}")
        return rel

    def files_under(self, folder):
        """The .c and .h files of folder and of its subfolders, sorted."""
        found = []
        for dirpath, dirnames, filenames in os.walk(os.path.join(self.root, folder)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in filenames:
                if name.endswith(SOURCE_SUFFIXES):
                    found.append(self.norm(os.path.relpath(os.path.join(dirpath, name), self.root)))
        return sorted(found)

    def includes(self, rel):
        if rel not in self._includes:
            self._includes[rel] = quoted_includes(os.path.join(self.root, rel))
        return self._includes[rel]

    def resolve(self, src, name, candidates):
        """The file that #include "name" in src means, or None (outside the tree: a
        system or other folder's header). candidates: the files to match by name when
        neither src's folder nor an include folder has it."""
        for base in [os.path.dirname(src)] + self.include_dirs:
            rel = self.norm(os.path.join(base, name))
            if not rel.startswith("../") and self.exists(rel):
                return rel
        matches = [f for f in candidates if f == name or f.endswith("/" + name)]
        if len(matches) > 1:
            raise LayeringError(
                f'{src}: #include "{name}" could be any of {", ".join(matches)}; '
                "say which with --include-dir")
        return matches[0] if matches else None

    def edges(self, folder, others=()):
        """[(src, line, included file)] for every quoted include of the files under
        folder that lands in the tree; a name is matched among the files under folder
        and the others."""
        files = self.files_under(folder)
        candidates = sorted(set(files).union(*(self.files_under(d) for d in others)))
        out = []
        for src in files:
            for line, name in self.includes(src):
                target = self.resolve(src, name, candidates)
                if target is not None:
                    out.append((src, line, target))
        return out


def module_graph(tree, folder):
    """{module: {module it depends on: [(file, line, included file)]}} inside folder."""
    folder = tree.folder(folder)
    graph = {module_of(f): {} for f in tree.files_under(folder)}
    for src, line, target in tree.edges(folder):
        a, b = module_of(src), module_of(target)
        if a != b and b in graph:
            graph[a].setdefault(b, []).append((src, line, target))
    return graph


def find_cycles(graph):
    """(circle [m1, m2, ..., m1], group) for each group of modules that reach each other
    (Tarjan's strongly connected components), in a stable order: one circle of the
    group, and the whole group."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []
    counter = [0]

    def visit(v):  # iterative, so that a deep graph cannot hit the recursion limit
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        group.append(m)
                        if m == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
            elif nxt not in index:
                index[nxt] = low[nxt] = counter[0]
                counter[0] += 1
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [(circle_in(graph, set(g)), g) for g in sorted(groups)]


def circle_in(graph, group):
    """A shortest circle through the first module of group, inside group."""
    start = min(group)
    paths, seen, frontier = {start: [start]}, {start}, [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt == start:
                    return paths[node] + [start]
                if nxt in group and nxt not in seen:
                    seen.add(nxt)
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError("a strongly connected group without a circle")


def check_no_cycles(tree, folder):
    """Lines describing each include circle among the modules of folder ([] if none)."""
    graph = module_graph(tree, folder)
    problems = []
    for circle, group in find_cycles(graph):
        problems.append(f"{folder}: include circle: {' -> '.join(circle)}")
        for a, b in zip(circle, circle[1:]):
            for src, line, target in graph[a][b]:
                problems.append(f"  {src}:{line}: includes {target}")
        if len(group) > len(circle) - 1:
            problems.append(f"  and more circles: {len(group)} modules reach each other: "
                            + ", ".join(group))
    return problems


def check_forbidden(tree, folder, banned):
    """Lines describing each include by a file of folder (or its subfolders) of a file
    that lies directly in one of the banned folders ([] if none)."""
    folder = tree.folder(folder)
    banned = [tree.folder(b) for b in banned]
    problems = []
    for src, line, target in tree.edges(folder, banned):
        home = os.path.dirname(target)
        if home in banned:
            problems.append(f"{src}:{line}: includes {target}, a file of {home or '.'}/, "
                            f"which {folder}/ may not include")
    return problems


def check_own_headers(tree, folder, api_headers=()):
    """Lines naming each header of folder that declares a function which a .c of folder
    other than the header's own defines ([] if none); api_headers are left out."""
    folder = tree.folder(folder)
    files = tree.files_under(folder)
    api = {tree.norm(h) for h in api_headers}
    definer = {}
    for f in files:
        if f.endswith(".c"):
            for name in top_level_functions(os.path.join(tree.root, f))[1]:
                definer.setdefault(name, f)
    problems = []
    for h in files:
        if not h.endswith(".h") or h in api:
            continue
        foreign = {}
        for name in top_level_functions(os.path.join(tree.root, h))[0]:
            src = definer.get(name)
            if src is not None and module_of(src) != module_of(h):
                foreign.setdefault(src, []).append(name)
        for src in sorted(foreign):
            problems.append(f"{h}: declares what {src} defines: {', '.join(sorted(foreign[src]))}")
    return problems


def parse_forbid(text):
    folder, sep, banned = text.partition(":")
    banned = [b for b in banned.split(",") if b]
    if not sep or not folder or not banned:
        raise argparse.ArgumentTypeError(f"{text!r}: want FOLDER:BANNED[,BANNED...]")
    return folder, banned


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.dirname(here))
    ap.add_argument("--include-dir", action="append", default=[], metavar="DIR")
    ap.add_argument("--no-cycles", action="append", default=[], metavar="FOLDER")
    ap.add_argument("--forbid", action="append", default=[], type=parse_forbid,
                    metavar="FOLDER:BANNED[,BANNED...]")
    ap.add_argument("--own-headers", action="append", default=[], metavar="FOLDER")
    ap.add_argument("--api-header", action="append", default=[], metavar="FILE")
    args = ap.parse_args(argv)
    if not args.no_cycles and not args.forbid and not args.own_headers:
        ap.error("no rule: give --no-cycles FOLDER, --forbid FOLDER:BANNED or --own-headers FOLDER")
    tree = Tree(args.root, args.include_dir)
    problems = []
    try:
        for folder in args.no_cycles:
            found = check_no_cycles(tree, folder)
            problems += found
            if not found:
                graph = module_graph(tree, folder)
                edges = sum(len(v) for v in graph.values())
                print(f"{folder}: {len(graph)} modules, {edges} dependencies, no include circle")
        for folder, banned in args.forbid:
            found = check_forbidden(tree, folder, banned)
            problems += found
            if not found:
                print(f"{folder}: includes nothing of {', '.join(b + '/' for b in banned)}")
        for folder in args.own_headers:
            found = check_own_headers(tree, folder, args.api_header)
            problems += found
            if not found:
                print(f"{folder}: each header declares only its own .c's functions")
    except LayeringError as e:
        print(f"check-layering: {e}", file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
