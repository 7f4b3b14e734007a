"""The benchmark plots of the documentation site, drawn with matplotlib from the committed records.

Every plot is a function of the ``Records`` of ``benchmarks/results/`` (the same records ``report.py``
renders the tables from), registered under the file name the pages use (``img/<name>.png`` under
``docs/benchmarks/``). The site's build (``tools/docs_hooks.py``) draws them all, so a plot cannot disagree
with its table; ``python benchmarks/docs_plots.py OUTDIR`` writes them to a folder to look at. A plot's title
names the record's date and how loaded the machine was (``report_base.load_words``).
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import plot  # noqa: E402
import report  # noqa: E402,F401  (registers every section, so the helpers below see them)
import report_peers  # noqa: E402
import report_sections  # noqa: E402
from report_base import NAMES, Records, load_words, rows_label  # noqa: E402

COLOURS = {"lineage": "#1f5fbf", "lineage-capture": "#6f9ee8", "lineage-equality": "#0b2f6b", "lineage-maintain": "#1f5fbf",
           "lineage-plain": "#6f9ee8", "pyiceberg": "#999999", "delta": "#3a9a4a", "ducklake": "#d4762c", "lance": "#8b4fb3",
           "paimon": "#b3434f"}
PLOTS: dict[str, Callable[[Records], bytes | None]] = {}


def plot_of(name: str) -> Callable[[Callable[[Records], bytes | None]], Callable[[Records], bytes | None]]:
    """Register a plot drawn into ``img/<name>.png``."""
    def register(fn: Callable[[Records], bytes | None]) -> Callable[[Records], bytes | None]:
        PLOTS[name] = fn
        return fn
    return register


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    _pyplot().close(fig)
    return buf.getvalue()


def _title(doc: dict[str, Any], what: str) -> str:
    return f"{what}\n{doc['date']}, machine {doc['machine']['name']}, {load_words(doc)}"


def _bars(ax: Any, labels: list[str], values: list[float | None], colours: list[str], unit: str) -> None:
    ys = range(len(labels))
    shown = [v if v is not None else 0.0 for v in values]
    ax.barh(list(ys), shown, color=colours)
    ax.set_yticks(list(ys), labels, fontsize=8)
    ax.invert_yaxis()
    for y, v in zip(ys, values, strict=True):
        ax.text((v or 0.0), y, f" {'n/a' if v is None else _num(v)}", va="center", fontsize=7)
    ax.set_xlabel(unit, fontsize=8)
    ax.margins(x=0.25)
    ax.grid(True, axis="x", alpha=0.3)


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else (f"{v:.2f}" if v >= 0.1 else f"{v:.3f}")


def _peers(records: Records, scale: int) -> bytes | None:
    doc = records.latest("run", where=report_peers.is_peer_run, scale=scale)
    if doc is None:
        return None
    s = doc["results"]["summary"]
    systems = list(doc["results"]["systems"])
    labels = [NAMES.get(x, x) for x in systems]
    colours = [COLOURS.get(x, "#555555") for x in systems]
    plt = _pyplot()
    panels = [("all writes", "time_s", "all writes, s"), ("all writes", "bytes_written", "all writes, MB written"),
              ("cdf (a) all", "time_s", "feed (a): all change commits, s"), ("cdf (b) last 5", "time_s", "feed (b): last 5 commits, s")]
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 3.4))
    for ax, (group, field, title) in zip(axes, panels, strict=True):
        vals = [s[field][group].get(x) for x in systems]
        if field == "bytes_written":
            vals = [None if v is None else v / 1e6 for v in vals]
        _bars(ax, labels, vals, colours, title)
        ax.set_title(title, fontsize=9)
    fig.suptitle(_title(doc, f"benchmarks/run.py at {rows_label(scale)} rows (n/a: the system has no such feed)"), fontsize=9)
    return _png(fig)


@plot_of("peers-1m")
def _peers_1m(records: Records) -> bytes | None:
    return _peers(records, 1_000_000)


@plot_of("peers-10m")
def _peers_10m(records: Records) -> bytes | None:
    return _peers(records, 10_000_000)


@plot_of("peers-30m")
def _peers_30m(records: Records) -> bytes | None:
    return _peers(records, 30_000_000)


@plot_of("feed-growth")
def _feed_growth(records: Records) -> bytes | None:
    data = plot.series(records)
    if not any(data.values()):
        return None
    buf = io.BytesIO()
    plot.draw(data, buf)
    return buf.getvalue()


@plot_of("cdc")
def _cdc(records: Records) -> bytes | None:
    doc = records.latest("cdc")
    if doc is None:
        return None
    done = [x for x in doc["results"]["systems"] if "error" not in x]
    labels = [NAMES.get(x["system"], x["system"]) if x["system"] != "lineage-equality" else "ours, equality strategy" for x in done]
    colours = [COLOURS.get(x["system"], "#555555") for x in done]
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.2))
    for ax, (field, title) in zip(axes, [("p50_ms", "commit p50, ms"), ("p99_ms", "commit p99, ms"),
                                          ("bytes_per_commit", "bytes per commit, KB")], strict=True):
        vals = [x.get(field) for x in done]
        if field == "bytes_per_commit":
            vals = [None if v is None else v / 1e3 for v in vals]
        _bars(ax, labels, vals, colours, title)
        ax.set_title(title, fontsize=9)
    r = doc["results"]
    fig.suptitle(_title(doc, f"benchmarks/cdc.py: {r['commits']} commits of {r['events']:,} change events into a "
                             f"{rows_label(doc['scale'])}-row table"), fontsize=9)
    return _png(fig)


@plot_of("history")
def _history(records: Records) -> bytes | None:
    found = records.select("history")
    if not found:
        return None
    kinds = report_sections._history_by_kind(found)  # noqa: SLF001 - the same records the history table shows
    bars: list[tuple[str, float | None, float | None, str]] = []
    docs = []
    for kind, group in sorted(kinds.items()):
        for doc in group:
            docs.append(doc)
            for system, x in doc["results"]["systems"].items():
                first = (x.get("first") or {}).get("time", {}).get("median")
                last = (x.get("last") or {}).get("time", {}).get("median")
                bars.append((f"{report_sections.HISTORY_NAMES.get(system, system)} ({kind})", first, last, COLOURS.get(system, "#555555")))
    if not bars:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(bars) + 1.6 + 0.2 * len(kinds)))
    ys = list(range(len(bars)))
    ax.barh([y - 0.2 for y in ys], [(b[1] or 0) * 1e3 for b in bars], height=0.4, color=[b[3] for b in bars], alpha=0.5, label="first commits")
    ax.barh([y + 0.2 for y in ys], [(b[2] or 0) * 1e3 for b in bars], height=0.4, color=[b[3] for b in bars], label="last commits")
    ax.set_xscale("log")
    left = ax.get_xlim()[0]
    for y, b in zip(ys, bars, strict=True):
        for off, v in ((-0.2, b[1]), (0.2, b[2])):
            ax.text(left if v is None else v * 1e3, y + off, f" {'not reached' if v is None else f'{v * 1e3:.1f} ms'}", va="center", fontsize=7)
    ax.set_yticks(ys, [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("median commit, ms (log scale)", fontsize=8)
    ax.legend(fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    loads = "\n".join(f"{d['date']}: {load_words(d)}" for d in docs)
    ax.set_title(f"benchmarks/history.py: median commit over the first and the last commits of a long history\n{loads}", fontsize=8)
    return _png(fig)


@plot_of("feed-stream")
def _feed_stream(records: Records) -> bytes | None:
    doc = report_sections._stream_doc(records)  # noqa: SLF001 - the record the feed-stream table shows
    if doc is None:
        return None
    systems = doc["results"]["systems"]
    labels = [report_sections.STREAM_SYSTEMS.get(k, k) for k in systems]
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 2.8))
    for ax, (field, title) in zip(axes, [("p50", "latency p50, s"), ("p99", "latency p99, s")], strict=True):
        _bars(ax, labels, [x["latency_s"][field] for x in systems.values()], ["#1f5fbf" if "delta" not in k else "#3a9a4a" for k in systems], title)
        ax.set_title(title, fontsize=9)
    fig.suptitle(_title(doc, "benchmarks/feed_stream.py: from a commit to its rows at the consumer"), fontsize=9)
    return _png(fig)


def draw_all(records: Records | None = None) -> dict[str, bytes]:
    """``{file name: PNG}`` of every plot whose records exist."""
    records = records or Records()
    out = {}
    for name, fn in PLOTS.items():
        png = fn(records)
        if png is not None:
            out[f"{name}.png"] = png
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = args[0] if args else "."
    os.makedirs(folder, exist_ok=True)
    for name, png in draw_all().items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(png)
        print(f"wrote {os.path.join(folder, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
