#!/usr/bin/env python3
"""plot.py RESULTS.jsonl OUT: the JSON lines of taskpush-bench as OUT.png and OUT.svg,
one panel for each kind of line found. The drain: tasks/s against K for every design,
each point the median of the verified runs of that design and K, the ceiling (one
connection, no K) a horizontal line. mixed: tasks/s end to end of each result beside
the no-op drain of the same run, with its ratio. soak: tasks/s, enqueue-to-start p99
and taskpushd's RSS of every sample over time."""
import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def drain_panel(ax, runs):
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
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def mixed_panel(ax, lines):
    labels, rates, ratios = [], [], []
    for o in lines:
        if o.get("case") == "drain":
            labels.append("no-op drain\n(preloaded)")
            ratios.append(None)
        else:
            size = o.get("payload_bytes", 0)
            labels.append("%s\n%s" % (o.get("case"), "header only" if size <= 20 else "%d B" % size))
            ratios.append(o.get("ratio"))
        rates.append(o.get("tasks_per_s") or 0)
    bars = ax.bar(range(len(rates)), rates, color=["grey"] + ["C0"] * (len(rates) - 1))
    for b, r in zip(bars, ratios):
        if r is not None:
            ax.annotate("%.2f× drain" % r, (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rates)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("tasks/s end to end")
    ax.grid(True, axis="y", alpha=0.3)


def soak_panels(axes, line):
    s = line.get("samples") or []
    t = [x.get("t") for x in s]
    for ax, key, label, scale in ((axes[0], "tasks_per_s", "tasks/s", 1),
                                  (axes[1], "start_p99_ms", "enqueue to start p99, ms", 1),
                                  (axes[2], "rss_kb", "taskpushd RSS, MB", 1 / 1024)):
        pts = [(a, x.get(key) * scale) for a, x in zip(t, s) if x.get(key) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".")
        ax.axvline(line.get("warmup_seconds", 0), linestyle=":", color="grey")
        ax.set_ylabel(label, fontsize=8)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[0].set_title("soak at %.0f tasks/s (0.8 × peak %.0f), %s B payloads; flat: %s"
                      % (line.get("paced_tasks_per_s") or 0, line.get("peak_tasks_per_s") or 0,
                         line.get("payload_len"), line.get("flat")), fontsize=8)
    axes[2].set_xlabel("seconds")


def main(path, out):
    runs, mixed, soak = {}, [], []
    settings = {}
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            if o.get("kind") == "settings":
                settings = o
            elif o.get("kind") == "run" and o.get("verified"):
                runs.setdefault(o["design"], {}).setdefault(o["k"], []).append(o["tasks_per_s"])
            elif o.get("kind") == "mixed" and o.get("verified"):
                mixed.append(o)
            elif o.get("kind") == "soak" and o.get("verified"):
                soak.append(o)
    rows = (1 if runs else 0) + (1 if mixed else 0) + 3 * len(soak[-1:])
    if rows == 0:
        sys.exit("plot.py: no verified drain, mixed or soak line in %s" % path)
    fig, axes = plt.subplots(rows, 1, figsize=(8, 3.2 * rows if rows > 1 else 5), squeeze=False)
    axes = [a[0] for a in axes]
    i = 0
    if runs:
        drain_panel(axes[i], runs)
        i += 1
    if mixed:
        mixed_panel(axes[i], mixed)
        i += 1
    if soak:
        soak_panels(axes[i:i + 3], soak[-1])
    srv = settings.get("server", {})
    axes[0].set_title("taskpush-bench %s, %s, MariaDB %s, flush_log_at_trx_commit=%s%s"
                      % (settings.get("date", ""), settings.get("host", ""), srv.get("version", "?"),
                         srv.get("innodb_flush_log_at_trx_commit", "?"),
                         "" if not soak or runs or mixed else "\n" + axes[0].get_title()),
                      fontsize=8)
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=120)
    fig.savefig(out + ".svg")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot.py RESULTS.jsonl OUT")
    main(sys.argv[1], sys.argv[2])
