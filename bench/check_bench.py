#!/usr/bin/env python3
"""check_bench.py PROGRAM MODE: the bench's tests (bench/meson.build), against the
private MariaDB of scripts/tp-mariadb (TASKPUSH_TEST_MYSQL_* in the environment).

  quick     taskpush-bench --quick --json-only exits 0, prints the settings line and
            one run line per design and K (ceiling once), each verified, with the
            figures every line must carry.
  sabotage  with --sabotage (a row set to FAILED after each drain) every run says
            verified false with a reason, and the exit status is 1.
  flags     bad flags exit 2 with a message; --help exits 0."""
import json
import subprocess
import sys

DESIGNS = ["cas", "cas-backoff", "skiplocked-1", "skiplocked-10", "ceiling",
           "taskpush-rr", "taskpush-ll"]
FIELDS = ["design", "k", "n", "seconds", "tasks_per_s", "statements_per_task",
          "row_lock_waits", "cas_misses", "claim_p50_ms", "claim_p99_ms",
          "mariadbd_cpu_s_per_1000", "taskpushd_cpu_s_per_1000", "taskpushd_peak_rss_kb",
          "verified"]

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(prog, args, timeout=600):
    p = subprocess.run([prog] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=timeout)
    sys.stderr.write(p.stderr)
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    return p.returncode, lines, p.stdout


def quick(prog):
    rc, lines, _ = run(prog, ["--quick", "--json-only"])
    check(rc == 0, "--quick exits 0 (got %d)" % rc)
    settings = [l for l in lines if l.get("kind") == "settings"]
    runs = [l for l in lines if l.get("kind") == "run"]
    check(len(settings) == 1, "one settings line")
    if settings:
        srv = settings[0].get("server", {})
        check(srv.get("innodb_flush_log_at_trx_commit") is not None and srv.get("version"),
              "settings name the server's version and flush setting")
    want = sorted((d, k) for d in DESIGNS for k in ([1] if d == "ceiling" else [4, 64]))
    got = sorted((r.get("design"), r.get("k")) for r in runs)
    check(got == want, "one run per design and K: %s" % got)
    for r in runs:
        name = "%s K=%s" % (r.get("design"), r.get("k"))
        check(all(f in r for f in FIELDS), name + ": every field present")
        check(r.get("verified") is True, name + ": verified (%s)" % r.get("why", ""))
        check(r.get("n", 0) > 0 and r.get("tasks_per_s", 0) > 0, name + ": n and tasks/s > 0")
        check(r.get("statements_per_task", 0) > 0, name + ": the server counted statements")
        tp = r.get("design", "").startswith("taskpush")
        check((r.get("taskpushd_peak_rss_kb") is not None) == tp,
              name + ": taskpushd RSS reported exactly for taskpush")
        check((r.get("claim_p50_ms") is not None) == (not tp),
              name + ": claim latency reported exactly for the polling designs")
        if not r.get("design", "").startswith("cas"):
            check(r.get("cas_misses") == 0, name + ": no CAS misses outside cas")


def sabotage(prog):
    rc, lines, _ = run(prog, ["--quick", "--json-only", "--k", "4", "--sabotage",
                              "--design", "ceiling,taskpush-ll,skiplocked-10"])
    check(rc == 1, "--sabotage exits 1 (got %d)" % rc)
    runs = [l for l in lines if l.get("kind") == "run"]
    check(len(runs) == 3, "three run lines")
    for r in runs:
        check(r.get("verified") is False and "SUCCESSFUL" in r.get("why", ""),
              "%s: verification failed and says why (%s)" % (r.get("design"), r.get("why")))


def flags(prog):
    # Each with a word the message must hold, so that "no database" cannot pass for it.
    for bad, word in ((["--k", "0"], "--k"), (["--k", "4,x"], "--k"),
                      (["--design", "nope"], "--design"), (["--n", "-5"], "--n"),
                      (["--repeat", "0"], "--repeat"), (["--capacity", "70000"], "--capacity"),
                      (["--db", "postgres://x@y/z"], "mysql://"),
                      (["--db", "mysql://u@h:99999/d"], "port"),
                      (["--bogus"], "bogus"), (["extra"], "extra")):
        p = subprocess.run([prog] + bad, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=30)
        check(p.returncode == 2 and word in p.stderr,
              "%s exits 2 naming %s (got %d: %s)" % (" ".join(bad), word, p.returncode,
                                                     p.stderr.strip()))
    p = subprocess.run([prog, "--help"], stdout=subprocess.PIPE, text=True, timeout=30)
    check(p.returncode == 0 and "--design" in p.stdout and "--sabotage" not in p.stdout,
          "--help exits 0 and lists the flags (not the hidden one)")


if __name__ == "__main__":
    {"quick": quick, "sabotage": sabotage, "flags": flags}[sys.argv[2]](sys.argv[1])
    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)
