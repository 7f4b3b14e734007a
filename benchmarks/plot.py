"""Plot how each system's change feed grows with the table: feed time and peak memory against table size.

Reads the newest published ``run.py`` record at every scale in ``benchmarks/results/`` and draws, for
every system with a change feed, feed (a) (all 25 change commits) and feed (b) (the last 5 commits) time
and the peak RSS of the feed steps against the table size, on log-log axes, into
``benchmarks/results/feed-growth.png``. ``run.py --publish`` calls it; it can be rerun on its own:

    .venv/bin/python benchmarks/plot.py [--out PATH]

Each point comes from one run; runs at different scales may come from different days and loads, which
the legend's caption says (the load of each record is in ``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import BinaryIO

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import record  # noqa: E402
import report  # noqa: E402
import report_peers  # noqa: E402

DEFAULT_OUT = os.path.join(record.RESULTS_DIR, "feed-growth.png")
STYLE = {  # system -> (label, colour, marker, line style)
    "lineage": ("ours", "#1f5fbf", "o", "-"),
    "lineage-capture": ("ours, pre-image capture", "#1f5fbf", "s", "--"),
    "ducklake": ("DuckLake", "#d4762c", "^", "-"),
    "delta": ("delta-rs", "#3a9a4a", "v", "-"),
    "lance": ("Lance (no pre-images)", "#8b4fb3", "D", ":"),
}
PANELS = (("cdf (a) all", "time_s", "feed (a): 25 change commits, s"), ("cdf (b) last 5", "time_s", "feed (b): last 5 commits, s"),
          (None, "peak_rss_mb", "peak RSS of the feed steps, MB"))


def series(records: report.Records) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Panel title -> system -> [(rows, value)] from the newest peer run at each scale."""
    scales = sorted({d["scale"] for d in records.select("run", where=report_peers.is_peer_run)})
    out: dict[str, dict[str, list[tuple[int, float]]]] = {title: {} for _, _, title in PANELS}
    for scale in scales:
        doc = records.latest("run", where=report_peers.is_peer_run, scale=scale)
        assert doc is not None
        s = doc["results"]["summary"]
        for group, field, title in PANELS:
            for system in STYLE:
                if system not in doc["results"]["systems"]:
                    continue
                value = s[field][group].get(system) if group else report_peers.feed_peak(s, system)
                if value is not None:
                    out[title].setdefault(system, []).append((scale, float(value)))
    return out


def draw(data: dict[str, dict[str, list[tuple[int, float]]]], out: str | BinaryIO) -> None:
    """Write the figure (PNG) to ``out``, a path or a binary file object."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 4.6))
    for ax, (_, _, title) in zip(axes, PANELS, strict=True):
        for system, points in data[title].items():
            label, colour, marker, line = STYLE[system]
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, color=colour, marker=marker, linestyle=line, label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("rows in the base table")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Change feed against table size (benchmarks/run.py; each scale is one run, see the benchmark pages for each run's load)", fontsize=10)
    fig.tight_layout()
    if isinstance(out, str):
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="where the PNG goes (default benchmarks/results/feed-growth.png)")
    args = parser.parse_args(argv)
    data = series(report.Records())
    if not any(data.values()):
        print("no published run.py record with peers in benchmarks/results/: nothing to plot")
        return 1
    draw(data, args.out)
    print(f"wrote {os.path.relpath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
