#!/usr/bin/env python3
"""plot.py RESULTS.jsonl OUT: tasks/s against K for every design, from the JSON lines
of taskpush-bench, as OUT.png and OUT.svg. Each point is the median of the verified
runs of that design and K; the ceiling (one connection, no K) is a horizontal line."""
import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, out):
    runs = {}
    settings = {}
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            if o.get("kind") == "settings":
                settings = o
            elif o.get("kind") == "run" and o.get("verified"):
                runs.setdefault(o["design"], {}).setdefault(o["k"], []).append(o["tasks_per_s"])
    fig, ax = plt.subplots(figsize=(8, 5))
    for design, by_k in runs.items():
        ks = sorted(by_k)
        rates = [statistics.median(by_k[k]) for k in ks]
        if design == "ceiling":
            ax.axhline(rates[0], linestyle="--", color="grey", label="ceiling (1 connection)")
        else:
            ax.plot(ks, rates, marker="o", label=design)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("K (polling clients or workers)")
    ax.set_ylabel("tasks/s (median, verified runs)")
    srv = settings.get("server", {})
    ax.set_title("taskpush-bench %s, %s, MariaDB %s, flush_log_at_trx_commit=%s"
                 % (settings.get("date", ""), settings.get("host", ""), srv.get("version", "?"),
                    srv.get("innodb_flush_log_at_trx_commit", "?")), fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=120)
    fig.savefig(out + ".svg")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot.py RESULTS.jsonl OUT")
    main(sys.argv[1], sys.argv[2])
