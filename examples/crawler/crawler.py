"""crawler: the page side of the taskpush crawler example (examples/crawler/README.md).

Owns URL normalisation, the dedup key of a URL, link extraction (html.parser), the
fetch (urllib, with a timeout) and the `crawl` handler that turns one fetch into a
task outcome; `python3 crawler.py worker ADDR` runs one worker process of it.
Standard library only, plus the taskpush package of python/.
"""
from __future__ import annotations

import argparse
import hashlib
import html.parser
import http.client
import json
import logging
import os
import posixpath
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Dict, List, Optional, Set, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import taskpush  # noqa: E402

TASK_TYPE = "crawl"
DEDUP_KEY_MAX = 191          # task.dedup_key is VARBINARY(191)
MAX_BODY = 4 << 20           # bytes of a page read at most; the rest is ignored
MAX_TITLE = 200              # characters of the title kept in the result
SUBMIT_WAIT_S = 30.0         # longest wait for a SUBMITTED (the commit of the links)
DEFAULT_PORTS = {"http": 80, "https": 443}
# What a path or query may hold unescaped (RFC 3986 pchar, '/', '?' and '%' of escapes).
_SAFE = "/:@!$&'()*+,;=-._~%?"


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4: '.' and '..' segments resolved; never above the root."""
    if not path:
        return "/"
    out: List[str] = []
    segs = path.split("/")
    for i, seg in enumerate(segs):
        last = i == len(segs) - 1
        if seg == ".":
            if last:
                out.append("")
        elif seg == "..":
            if len(out) > 1:
                out.pop()
            if last:
                out.append("")
        else:
            out.append(seg)
    res = "/".join(out)
    return res if res.startswith("/") else "/" + res


def _upper_escapes(s: str) -> str:
    """%2f and %2F are the same octet: write escapes in upper case."""
    parts = s.split("%")
    for i in range(1, len(parts)):
        p = parts[i]
        if len(p) >= 2 and all(c in "0123456789abcdefABCDEF" for c in p[:2]):
            parts[i] = p[:2].upper() + p[2:]
        else:
            parts[i] = "25" + p  # a lone '%' is escaped itself
    return "%".join(parts)


def normalise(url: str, base: Optional[str] = None) -> Optional[str]:
    """The absolute form of url (resolved against base when relative): scheme and
    host lower-cased, default port, user info and fragment dropped, dot segments
    resolved, an empty path made '/', unsafe characters percent-encoded (UTF-8).
    None for what the crawler does not fetch: not http/https, no host, a bad port."""
    url = url.strip()
    if base is not None:
        try:
            url = urllib.parse.urljoin(base, url)
        except ValueError:
            return None
    try:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        host = parts.hostname  # lower-cased, brackets of IPv6 removed
        port = parts.port
    except ValueError:
        return None
    if scheme not in DEFAULT_PORTS or not host:
        return None
    host = host.rstrip(".")
    if not host or any(c in host for c in "/\\ %@"):
        return None
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None or port == DEFAULT_PORTS[scheme] else f"{host}:{port}"
    path = _upper_escapes(urllib.parse.quote(_remove_dot_segments(parts.path), safe=_SAFE))
    query = _upper_escapes(urllib.parse.quote(parts.query, safe=_SAFE))
    return urllib.parse.urlunsplit((scheme, netloc, path, query, ""))


def host_of(url: str) -> str:
    """The host of a normalised URL: a link is followed when its host is the page's
    (the scheme and the port may differ, so http://h/ redirecting to https://h/ is
    followed)."""
    return urllib.parse.urlsplit(url).hostname or ""


def dedup_key(url: str) -> str:
    """The URL itself, or 'sha256:' + its SHA-256 in hex when longer than the
    column's 191 bytes (a URL holds no such prefix, so the two cannot collide)."""
    if len(url.encode()) <= DEDUP_KEY_MAX:
        return url
    return "sha256:" + hashlib.sha256(url.encode()).hexdigest()


class LinkParser(html.parser.HTMLParser):
    """Collects the href of <a> and <area>, the first <base href> and the <title>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hrefs: List[str] = []
        self.base: Optional[str] = None
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        if tag in ("a", "area", "base"):
            href = next((v for k, v in attrs if k == "href" and v is not None), None)
            if href is None:
                return
            if tag == "base":
                if self.base is None:
                    self.base = href
            elif len(self.hrefs) < 100000:
                self.hrefs.append(href)
        elif tag == "title":
            self._in_title = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title and len(self.title) < MAX_TITLE:
            self.title += data


def extract_links(page_url: str, body: str) -> Tuple[str, List[str]]:
    """The title and the distinct same-host links of a page, normalised, in order."""
    p = LinkParser()
    p.feed(body)
    p.close()
    base = normalise(p.base, page_url) if p.base else page_url
    host = host_of(page_url)
    seen: Set[str] = set()
    links: List[str] = []
    for href in p.hrefs:
        u = normalise(href, base or page_url)
        if u is not None and u not in seen and host_of(u) == host:
            seen.add(u)
            links.append(u)
    return " ".join(p.title.split())[:MAX_TITLE], links


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is a link to its target (a task of its own), not followed in place."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


class Transient(Exception):
    """A failure worth another attempt (timeout, connection error, 5xx)."""


class Permanent(Exception):
    """A failure no retry mends (404 and other 4xx, a bad URL)."""


class Page:
    def __init__(self, status: int, ctype: str, body: str, location: Optional[str] = None) -> None:
        self.status, self.ctype, self.body, self.location = status, ctype, body, location


def fetch(url: str, timeout_s: float) -> Page:
    """GET url: a Page for 2xx and 3xx, Permanent or Transient otherwise."""
    opener = urllib.request.build_opener(_NoRedirect)
    req = urllib.request.Request(url, headers={"User-Agent": "taskpush-crawler/1"})
    deadline = time.monotonic() + timeout_s
    try:
        with opener.open(req, timeout=timeout_s) as r:
            ctype = r.headers.get_content_type()
            charset = r.headers.get_content_charset() or "utf-8"
            chunks, n = [], 0
            # The socket timeout bounds each read; the deadline bounds the whole body.
            while n < MAX_BODY and ctype == "text/html":
                if time.monotonic() > deadline:
                    raise Transient(f"timeout: the body took more than {timeout_s:g} s")
                c = r.read(min(65536, MAX_BODY - n))
                if not c:
                    break
                chunks.append(c)
                n += len(c)
            try:
                text = b"".join(chunks).decode(charset, "replace")
            except LookupError:
                text = b"".join(chunks).decode("utf-8", "replace")
            return Page(r.status, ctype, text)
    except urllib.error.HTTPError as e:
        code = e.code
        e.close()
        if 300 <= code < 400:
            return Page(code, "", "", e.headers.get("Location"))
        msg = f"HTTP {code} {e.reason}"
        if 400 <= code < 500 and code not in (408, 429):
            raise Permanent(msg) from None
        raise Transient(msg) from None
    except (socket.timeout, TimeoutError) as e:
        raise Transient(f"timeout: no answer within {timeout_s:g} s") from e
    except urllib.error.URLError as e:
        if isinstance(e.reason, (socket.timeout, TimeoutError)):
            raise Transient(f"timeout: no answer within {timeout_s:g} s") from None
        raise Transient(f"connection failed: {e.reason}") from None
    except (OSError, ValueError, http.client.HTTPException) as e:
        raise Transient(f"fetch failed: {type(e).__name__}: {e}") from None


class Crawler:
    """The `crawl` handler of one worker process: fetch, extract, submit the new
    links through the dispatcher (a producer connection of its own, shared by the
    handler threads), return the short result."""

    def __init__(self, addresses: str, timeout_s: float, attempts: int, task_timeout_ms: int,
                 token: Optional[str] = None) -> None:
        self.timeout_s, self.attempts, self.task_timeout_ms = timeout_s, attempts, task_timeout_ms
        self.client = taskpush.Client(addresses, token=token, name=f"crawler-submit-{os.getpid()}")
        # URLs this process has submitted already: not sent again. Only an
        # optimisation: the dedup_key is what keeps a URL to one row.
        self._sent: Set[str] = set()
        self._lock = threading.Lock()

    def task_for(self, url: str) -> "taskpush.proto.SubmitTask":
        return taskpush.make_task(TASK_TYPE, url, dedup_key=dedup_key(url), max_attempts=self.attempts,
                                  timeout_ms=self.task_timeout_ms)

    def submit_new(self, urls: List[str]) -> int:
        """Submits the URLs this process has not sent yet; the number the
        dispatcher inserted (the others were duplicates)."""
        with self._lock:
            todo = [u for u in urls if u not in self._sent]
        inserted = 0
        for i in range(0, len(todo), taskpush.proto.MAX_SUBMIT_TASKS):
            part = todo[i:i + taskpush.proto.MAX_SUBMIT_TASKS]
            receipts = self.client.submit_many([self.task_for(u) for u in part], timeout_s=SUBMIT_WAIT_S)
            inserted += sum(1 for r in receipts if not r.duplicate)
            with self._lock:
                self._sent.update(part)
        return inserted

    def handle(self, task: taskpush.Task) -> bytes:
        url = task.payload.decode("utf-8", "replace")
        if normalise(url) != url:
            raise taskpush.PermanentFailure(f"not a normalised http(s) URL: {url[:200]}")
        last = task.attempt >= self.attempts
        try:
            page = fetch(url, self.timeout_s)
        except Permanent as e:
            raise taskpush.PermanentFailure(str(e)) from None
        except Transient as e:
            if last:
                raise taskpush.PermanentFailure(f"{e} (attempt {task.attempt} of {self.attempts})") from None
            raise taskpush.Fail(f"{e} (attempt {task.attempt} of {self.attempts}, will retry)") from None
        title, links = "", []
        if page.location is not None:
            target = normalise(page.location, url)
            if target is not None and host_of(target) == host_of(url):
                links = [target]
        elif page.ctype == "text/html":
            title, links = extract_links(url, page.body)
        try:
            new = self.submit_new(links)
        except (taskpush.SubmitError, TimeoutError) as e:  # Unavailable included: try the page later
            raise taskpush.Fail(f"submitting links failed: {e}") from None
        return json.dumps({"status": page.status, "title": title, "links": len(links), "new": new,
                           "type": page.ctype}, ensure_ascii=False).encode()


def worker_main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="crawler.py worker", description="one crawl worker process")
    ap.add_argument("address", help="the dispatcher's worker port, HOST:PORT")
    ap.add_argument("--threads", type=int, default=8, help="concurrent fetches (default 8)")
    ap.add_argument("--timeout", type=float, default=5.0, help="fetch timeout in seconds (default 5)")
    ap.add_argument("--attempts", type=int, default=2, help="attempts of a page (default 2)")
    ap.add_argument("--task-timeout-ms", type=int, default=60000)
    a = ap.parse_args(argv)
    if not 1 <= a.threads <= 256 or not 0 < a.timeout <= 3600 or not 1 <= a.attempts <= 100:
        ap.error("--threads 1-256, --timeout 0-3600 s, --attempts 1-100")
    logging.basicConfig(level=os.environ.get("CRAWL_LOG", "WARNING"), stream=sys.stderr,
                        format="%(asctime)s crawler[%(process)d] %(levelname)s %(message)s")
    c = Crawler(a.address, a.timeout, a.attempts, a.task_timeout_ms, os.environ.get("TASKPUSH_TOKEN"))
    w = taskpush.Worker(a.address, name=f"crawler-{os.getpid()}", token=os.environ.get("TASKPUSH_TOKEN"))
    w.add_handler(TASK_TYPE, c.handle, concurrency=a.threads)
    w.install_signal_handlers()
    try:
        w.run()
    finally:
        c.client.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "worker":
        print("usage: crawler.py worker HOST:PORT [--threads N] [--timeout S] [--attempts N]", file=sys.stderr)
        sys.exit(2)
    sys.exit(worker_main(sys.argv[2:]))
