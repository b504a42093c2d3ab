"""test_urlnorm: the crawler example's URL normalisation, dedup keys and link
extraction (examples/crawler/crawler.py), case by case. Prints TAP."""
from __future__ import annotations

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import tplib  # noqa: E402  (puts python/ on sys.path)

sys.path.insert(0, str(tplib.SOURCE_ROOT / "examples" / "crawler"))
import crawler  # noqa: E402

BASE = "http://example.com/a/b/c.html"


class Normalise(unittest.TestCase):
    def test_absolute(self) -> None:
        cases = [
            ("HTTP://Example.COM/Path", "http://example.com/Path"),      # path case kept
            ("http://example.com", "http://example.com/"),              # empty path
            ("http://example.com:80/x", "http://example.com/x"),        # default port
            ("https://example.com:443/x", "https://example.com/x"),
            ("http://example.com:443/x", "http://example.com:443/x"),   # not the default for http
            ("https://example.com:8443/x", "https://example.com:8443/x"),
            ("http://example.com/x#frag", "http://example.com/x"),
            ("http://example.com/x?q=1#frag", "http://example.com/x?q=1"),
            ("http://example.com/a/./b/../c", "http://example.com/a/c"),
            ("http://example.com/a/b/c/./../../g", "http://example.com/a/g"),
            ("http://example.com/../../x", "http://example.com/x"),     # never above the root
            ("http://example.com/a/..", "http://example.com/"),
            ("http://example.com/a/.", "http://example.com/a/"),
            ("http://user:pw@Example.com/x", "http://example.com/x"),   # user info dropped
            ("http://example.com./x", "http://example.com/x"),          # trailing dot of the host
            ("http://[::1]:80/x", "http://[::1]/x"),
            ("http://[::1]:8080/x", "http://[::1]:8080/x"),
            ("http://example.com/with space", "http://example.com/with%20space"),
            ("http://example.com/caf\u00e9", "http://example.com/caf%C3%A9"),
            ("http://example.com/%7ex%2f", "http://example.com/%7Ex%2F"),  # escapes upper-cased
            ("http://example.com/100%", "http://example.com/100%25"),      # a lone '%'
            ("  http://example.com/x  ", "http://example.com/x"),
            ("http://example.com/x?a=1&b=%2f", "http://example.com/x?a=1&b=%2F"),
        ]
        for url, want in cases:
            with self.subTest(url=url):
                self.assertEqual(crawler.normalise(url), want)
                self.assertEqual(crawler.normalise(want), want, "normalising twice changes nothing")

    def test_relative(self) -> None:
        cases = [
            ("d.html", "http://example.com/a/b/d.html"),
            ("./d.html", "http://example.com/a/b/d.html"),
            ("../d.html", "http://example.com/a/d.html"),
            ("../../../../d.html", "http://example.com/d.html"),
            ("/d.html", "http://example.com/d.html"),
            ("//Other.example/d", "http://other.example/d"),
            ("?q=2", "http://example.com/a/b/c.html?q=2"),
            ("#top", "http://example.com/a/b/c.html"),
            ("", "http://example.com/a/b/c.html"),
            ("https://example.com/z", "https://example.com/z"),
        ]
        for href, want in cases:
            with self.subTest(href=href):
                self.assertEqual(crawler.normalise(href, BASE), want)

    def test_refused(self) -> None:
        for url in ["mailto:a@example.com", "javascript:void(0)", "ftp://example.com/x", "data:text/html,hi",
                    "http:///x", "http://example.com:99999/x", "http://example.com:port/x", "file:///etc/passwd",
                    "/relative/without/base", "tel:+123"]:
            with self.subTest(url=url):
                self.assertIsNone(crawler.normalise(url))

    def test_host(self) -> None:
        self.assertEqual(crawler.host_of("http://example.com/x"), "example.com")
        self.assertEqual(crawler.host_of("https://example.com:8443/x"), "example.com")
        self.assertEqual(crawler.host_of("http://[::1]:8080/x"), "::1")

    def test_dedup_key(self) -> None:
        short = "http://example.com/x"
        self.assertEqual(crawler.dedup_key(short), short)
        edge = "http://example.com/" + "a" * (191 - len("http://example.com/"))
        self.assertEqual(crawler.dedup_key(edge), edge)  # 191 bytes fit the column
        long = edge + "b"
        k = crawler.dedup_key(long)
        self.assertTrue(k.startswith("sha256:") and len(k) == 7 + 64, k)
        self.assertNotEqual(k, crawler.dedup_key(long + "c"))
        self.assertEqual(k, crawler.dedup_key(long))
        wide = "http://example.com/" + "\u00e9" * 90  # 199 bytes in UTF-8, 109 characters
        self.assertTrue(crawler.dedup_key(wide).startswith("sha256:"))


class Links(unittest.TestCase):
    def test_extract(self) -> None:
        html = """<html><head><title> The
          page </title></head><body>
          <a href="d.html">1</a> <a href="d.html#x">dup with a fragment</a>
          <A HREF="/e.html">2</A> <a href="http://EXAMPLE.com:80/e.html">dup, absolute</a>
          <a href="https://example.com:8443/s">another scheme and port, the same host</a>
          <a href="http://other.example/f">other host</a> <a href="mailto:x@y">mail</a>
          <a>no href</a> <a href="#top">self</a> <area href="../g.html">
          <a href="q?a=1&amp;b=2">entity</a></body></html>"""
        title, links = crawler.extract_links(BASE, html)
        self.assertEqual(title, "The page")
        self.assertEqual(links, ["http://example.com/a/b/d.html", "http://example.com/e.html",
                                 "https://example.com:8443/s", BASE,
                                 "http://example.com/a/g.html", "http://example.com/a/b/q?a=1&b=2"])

    def test_base(self) -> None:
        title, links = crawler.extract_links(BASE, '<base href="/root/"><a href="x">x</a>')
        self.assertEqual((title, links), ("", ["http://example.com/root/x"]))


if __name__ == "__main__":
    tplib.tap_main(__name__)
