"""test_crawler: examples/crawler/run.sh end to end on a generated site.

A local http.server serves a site generated here, whose truth (the pages reachable
from the seed, the broken links, the page that times out) is computed from the
generator's own link graph, never from the crawler's code. run.sh --db crawls it
into a fresh database of the test MariaDB (scripts/tp-mariadb's environment, as
tests/python), with the real taskpushd of the build; the test then checks the
task table against the truth. Prints TAP.
"""
from __future__ import annotations

import collections
import http.server
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import unittest
from typing import Dict, List, Set, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import tplib  # noqa: E402

N_PAGES = 2500       # reachable HTML pages /p/N.html
N_UNREACHED = 40     # /u/N.html: link into the site, nothing links to them
N_BROKEN = 6         # /missing/N.html answer 404
FETCH_TIMEOUT_S = 3  # the crawler's --timeout; /slow.html answers after SLOW_S
SLOW_S = 6.0
LONG_QUERY = "q=" + "x" * 300  # a URL longer than the 191-byte dedup_key: hashed


class Site:
    """The generated pages (path -> status, content type, body) and, per page, the
    canonical same-host URLs it links to."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.origin = f"http://127.0.0.1:{port}"
        self.pages: Dict[str, Tuple[int, str, bytes]] = {}
        self.links: Dict[str, Set[str]] = {}  # path -> canonical URLs on this host
        self.hits: Dict[str, int] = collections.Counter()
        self.lock = threading.Lock()
        self._build(random.Random(12))

    def url(self, path: str) -> str:
        return self.origin + path

    def _html(self, path: str, title: str, hrefs: List[Tuple[str, str]]) -> None:
        """hrefs: (href as written, canonical target path or '' when it leaves the site)."""
        body = "".join(f'<p><a href="{h}">link</a></p>\n' for h, _ in hrefs)
        self.pages[path] = (200, "text/html; charset=utf-8",
                            f"<html><head><title>{title}</title></head><body>\n{body}</body></html>".encode())
        self.links[path] = {self.url(t) for _, t in hrefs if t}

    def _build(self, rnd: random.Random) -> None:
        o = self.origin
        for i in range(N_PAGES):
            own = f"/p/{i}.html"
            hrefs: List[Tuple[str, str]] = []
            for j in (2 * i + 1, 2 * i + 2):  # a binary tree: every page reachable from /p/0.html
                if j < N_PAGES:
                    hrefs.append((f"{j}.html", f"/p/{j}.html"))
            for _ in range(3):  # cycles, back links, duplicates, written in every form
                j = rnd.randrange(N_PAGES)
                t = f"/p/{j}.html"
                form = rnd.randrange(7)
                hrefs.append(([f"./{j}.html", f"../p/{j}.html", f"{o}/p/{j}.html#sec{j}",
                               f"HTTP://127.0.0.1:{self.port}/x/../p/{j}.html", f"/p/./{j}.html",
                               f"{j}.html#top", f"//127.0.0.1:{self.port}/p/{j}.html"][form], t))
            hrefs.append(("0.html", "/p/0.html"))
            hrefs.append(("#self", own))
            if i % 500 == 7:  # other hosts (the same server under another name): never followed
                hrefs.append((f"http://localhost:{self.port}/offsite/{i}.html", ""))
                hrefs.append(("http://example.invalid/nowhere.html", ""))
                hrefs.append(("mailto:someone@example.invalid", ""))
                hrefs.append(("javascript:void(0)", ""))
            if i % 400 == 3:
                k = (i // 400) % N_BROKEN
                hrefs.append((f"/missing/{k}.html", f"/missing/{k}.html"))
            if i in (11, 12):
                hrefs.append(("/slow.html", "/slow.html"))
                hrefs.append((f"/files/data{i}.bin", f"/files/data{i}.bin"))
                hrefs.append(("/files/notes.txt", "/files/notes.txt"))
                hrefs.append((f"/p/long.html?{LONG_QUERY}", f"/p/long.html?{LONG_QUERY}"))
                hrefs.append(("/redirect", "/redirect"))
            self._html(own, f"Page {i}", hrefs)
        for i in range(N_UNREACHED):
            self._html(f"/u/{i}.html", f"Unreached {i}", [("/p/5.html", "/p/5.html"),
                                                         (f"/u/{(i + 1) % N_UNREACHED}.html",
                                                          f"/u/{(i + 1) % N_UNREACHED}.html")])
        for i in range(N_PAGES):
            if i % 500 == 7:
                self._html(f"/offsite/{i}.html", "Offsite", [])
        self._html(f"/p/long.html?{LONG_QUERY}", "Long", [("/p/3.html", "/p/3.html")])
        self._html("/p/redirected.html", "Redirected", [("/p/4.html", "/p/4.html")])
        self.pages["/redirect"] = (302, "text/html", b"moved")
        self.links["/redirect"] = {self.url("/p/redirected.html")}
        for i in (11, 12):
            self.pages[f"/files/data{i}.bin"] = (200, "application/octet-stream", bytes(range(256)) * 8)
            self.links[f"/files/data{i}.bin"] = set()
        # Text that looks like HTML but is served as text/plain: its links are not followed.
        self.pages["/files/notes.txt"] = (200, "text/plain", b'<a href="/u/0.html">not a link</a>')
        self.links["/files/notes.txt"] = set()
        self._html("/slow.html", "Slow", [("/u/1.html", "/u/1.html")])  # answered too late to count

    def truth(self) -> Tuple[Set[str], Set[str], Set[str]]:
        """(URLs that must end SUCCESSFUL, URLs answering 404, URLs that time out).
        The slow page never answers in time, so its own links are not followed."""
        slow_url = self.url("/slow.html")
        seen, todo = {self.url("/p/0.html")}, [self.url("/p/0.html")]
        while todo:
            u = todo.pop()
            if u == slow_url:
                continue
            for t in self.links.get(u[len(self.origin):], set()):
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        slow = {slow_url} & seen
        broken = {u for u in seen if u[len(self.origin):] not in self.pages}
        return seen - broken - slow, broken, slow


class Handler(http.server.BaseHTTPRequestHandler):
    site: Site  # set on the subclass made per server

    def do_GET(self) -> None:
        s = self.site
        with s.lock:
            s.hits[self.path] += 1
        if self.path == "/slow.html":
            time.sleep(SLOW_S)
        page = s.pages.get(self.path)
        try:
            if page is None:
                self.send_error(404, "Not Found")
                return
            status, ctype, body = page
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if status == 302:
                self.send_header("Location", "/p/redirected.html#moved")
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the crawler gave up (the slow page): nothing to answer

    def log_message(self, format: str, *args: object) -> None:
        pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # listen() backlog for 24 fetches at once (the default is 5)


class Crawl(unittest.TestCase):
    def setUp(self) -> None:
        self.db = tplib.TestDB("crawl")
        self.server = Server(("127.0.0.1", 0), Handler)
        self.site = Site(self.server.server_address[1])
        self.server.RequestHandlerClass = type("SiteHandler", (Handler,), {"site": self.site})
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def tearDown(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.db.drop()

    def test_crawl_matches_the_site(self) -> None:
        ok, broken, slow = self.site.truth()
        self.assertGreater(len(ok), N_PAGES)
        self.assertEqual((len(broken), len(slow)), (N_BROKEN, 1), "the generator's own truth")
        run = tplib.SOURCE_ROOT / "examples" / "crawler" / "run.sh"
        # Start from a non-normalised form of the seed.
        seed = f"HTTP://127.0.0.1:{self.site.port}/p/./0.html#start"
        r = subprocess.run([str(run), "--db", self.db.url, "--workers", "3", "--threads", "8",
                            "--timeout", str(FETCH_TIMEOUT_S), "--attempts", "2", seed],
                           capture_output=True, timeout=300)
        out, err = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
        self.assertEqual(r.returncode, 0, f"run.sh failed:\n{out}\n{err}")

        rows = self.db.rows("SELECT payload, task_state, COALESCE(err_msg, ''), COALESCE(result, ''), dedup_key "
                            "FROM task WHERE task_type = 'crawl'")
        urls = [row[0] for row in rows]
        dup = [u for u, n in collections.Counter(urls).items() if n > 1]
        self.assertEqual(dup, [], "a URL in two rows")
        by_state: Dict[str, Set[str]] = collections.defaultdict(set)
        for u, state, _, _, _ in rows:
            by_state[state].add(u)
        self.assertEqual(set(by_state), {"2", "3"}, "rows left NEW or PROCESSING")
        self.assertEqual(by_state["2"], ok, "SUCCESSFUL rows: missing %s, extra %s" % (
            sorted(ok - by_state["2"])[:5], sorted(by_state["2"] - ok)[:5]))
        self.assertEqual(by_state["3"], broken | slow)
        m = re.search(r"^crawled (\d+) pages$", out, re.M)
        self.assertIsNotNone(m, out)
        assert m is not None
        self.assertEqual(int(m.group(1)), len(ok))
        self.assertEqual(out.rstrip().splitlines()[-1], f"crawled {len(ok)} pages", "the last line")

        for u, state, msg, result, key in rows:
            path = u[len(self.site.origin):]
            with self.subTest(url=u[:80]):
                if u in broken:
                    self.assertIn("HTTP 404", msg)
                    self.assertIn(f"failed {u}: ", out)
                elif u in slow:
                    self.assertIn("timeout", msg)
                    self.assertIn("attempt 2 of 2", msg)
                else:
                    res = json.loads(result)
                    self.assertEqual(res["links"], len(self.site.links[path]), "distinct same-host links")
                    status = self.site.pages[path][0]
                    self.assertEqual(res["status"], status)
                    if path.startswith("/p/") and path.endswith(".html") and path[3:-5].isdigit():
                        self.assertEqual(res["title"], f"Page {path[3:-5]}")
                if len(u) > 191:
                    self.assertTrue(key.startswith("sha256:") and len(key) == 71, key)
                else:
                    self.assertEqual(key, u)
        # The server's side: nothing off the site or unreachable was fetched.
        fetched = set(self.site.hits)
        self.assertFalse({p for p in fetched if p.startswith(("/u/", "/offsite/"))}, "unreachable pages fetched")
        self.assertGreaterEqual(self.site.hits["/slow.html"], 2, "the slow page tried twice")
        print(f"# crawled {len(ok)} pages, {len(broken)} broken, {len(slow)} slow", flush=True)

    def run_sh(self, *args: str) -> Tuple[int, str, str]:
        run = tplib.SOURCE_ROOT / "examples" / "crawler" / "run.sh"
        r = subprocess.run([str(run), *args], capture_output=True, timeout=120)
        return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")

    def test_fresh_database_again_and_bad_flags(self) -> None:
        name = self.db.name + "_fresh"
        url = self.db.url.rsplit("/", 1)[0] + "/" + name
        seed = self.site.url("/files/notes.txt")  # text/plain: one page, its "link" not followed
        try:
            rc, out, err = self.run_sh("--db", url, "--workers", "1", "--threads", "2", seed)
            self.assertEqual(rc, 0, f"{out}\n{err}")
            self.assertEqual(out.splitlines()[-1], "crawled 1 pages")
            self.assertIn("loading", err)  # the schema went into the new database
            rows = self.db.rows(f"SELECT payload, task_state, result FROM `{name}`.task")
            self.assertEqual(len(rows), 1, rows)
            u, state, result = rows[0]
            self.assertEqual((u, state), (seed, "2"))
            self.assertEqual(json.loads(result)["type"], "text/plain")
            self.assertEqual(json.loads(result)["links"], 0)
            # The same seed again: a duplicate, nothing new to crawl.
            rc, out, err = self.run_sh("--db", url, "--workers", "1", "--threads", "2", seed)
            self.assertEqual(rc, 0, f"{out}\n{err}")
            self.assertEqual(out.splitlines()[-1], "crawled 0 pages")
            self.assertIn("in the table already", err)
            self.assertEqual(self.db.value(f"SELECT COUNT(*) FROM `{name}`.task"), "1")
        finally:
            self.db.exec(f"DROP DATABASE IF EXISTS `{name}`")
        self.assertEqual(self.site.hits["/u/0.html"], 0)
        for bad in (["ftp://127.0.0.1/x"], ["/relative"], [], ["--workers", "0", seed], ["--bogus", seed],
                    ["--db", "postgres://u@h/x", seed], [seed, seed]):
            with self.subTest(args=bad):
                rc, out, err = self.run_sh(*bad)
                self.assertEqual(rc, 2, f"{bad}: {out}\n{err}")
                self.assertTrue(err.strip(), "a message on stderr")

    def test_table_beside_a_team_table(self) -> None:
        """--table jobs (taskpushd --table): the crawl's rows go to jobs, made by --migrate
        in a database whose own table task (not taskpush's) stays as it was."""
        name = self.db.name + "_jobs"
        url = self.db.url.rsplit("/", 1)[0] + "/" + name
        seed = self.site.url("/files/notes.txt")
        self.db.exec(f"CREATE DATABASE `{name}`; CREATE TABLE `{name}`.task (task_id BIGINT PRIMARY KEY,"
                     f" task_state INT NOT NULL); INSERT INTO `{name}`.task VALUES (1, 1), (2, 3)")
        try:
            rc, out, err = self.run_sh("--db", url, "--table", "jobs", "--workers", "1", "--threads", "2", seed)
            self.assertEqual(rc, 0, f"{out}\n{err}")
            self.assertEqual(out.splitlines()[-1], "crawled 1 pages")
            self.assertIn("--table jobs --migrate", err)
            self.assertEqual(self.db.rows(f"SELECT payload, task_state FROM `{name}`.jobs"), [[seed, "2"]])
            self.assertEqual(self.db.rows(f"SELECT task_id, task_state FROM `{name}`.task ORDER BY task_id"),
                             [["1", "1"], ["2", "3"]])
            self.assertEqual(sorted(r[0] for r in self.db.rows(
                f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{name}'")),
                ["jobs", "jobs_claim", "jobs_dep", "jobs_meta", "jobs_progress", "jobs_schedule", "jobs_setting", "task"])
        finally:
            self.db.exec(f"DROP DATABASE IF EXISTS `{name}`")
        for bad in ("9jobs", "jobs;x", "j" * 37):
            with self.subTest(table=bad):
                rc, out, err = self.run_sh("--table", bad, seed)
                self.assertEqual(rc, 2, f"{bad}: {out}\n{err}")
                self.assertIn("--table", err)


if __name__ == "__main__":
    tplib.tap_main(__name__)
