"""A picture of a table's history: inserts, updates and deletes per version, and the CDF retention window.

``lineage log TABLE --plot out.html`` (or ``out.svg``) draws it with no extra
dependency; ``--plot out.png`` uses matplotlib (``pip install
'iceberg-row-lineage[plot]'``). The y axis is logarithmic by default, so a
10-row delete stays visible next to a million-row load.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from lineage.errors import InvalidArgumentError

SERIES = (("inserted", "#2e9e44", "inserts"), ("updated", "#2f6fd0", "updates"), ("deleted", "#d1453b", "deletes"))
ROW_OPERATIONS = ("append", "delete", "update", "upsert", "merge", "changelog", "purge")
PLOT_SUFFIXES = (".html", ".htm", ".svg", ".png")


@dataclass(frozen=True)
class Commit:
    """One version of the log as the plot needs it."""

    version: int
    timestamp: _dt.datetime
    operation: str
    inserted: int
    updated: int
    deleted: int
    foreign: str | None = None  # the engine that made a reconciled foreign commit (lineage.reconcile)
    gap: bool = False  # expired foreign snapshots folded into this commit (lineage.reconcile.gap)


@dataclass(frozen=True)
class History:
    """What the plot shows: the commits, the retention window and the versions that still have snapshots."""

    table: str
    commits: Sequence[Commit]
    oldest: int  # change-feed ranges may start at this version: changes of versions > oldest are available
    current: int
    snapshots: Sequence[int]  # versions that can still be time-travelled to
    retention: str  # human description of the retention properties


def check_plot_path(path: str) -> str:
    """The plot's kind from its file name; refuses unknown suffixes before any work is done."""
    lower = path.lower()
    for suffix in PLOT_SUFFIXES:
        if lower.endswith(suffix):
            if suffix == ".png":
                try:
                    import matplotlib  # noqa: F401
                except ImportError:
                    raise InvalidArgumentError(
                        "--plot out.png needs matplotlib (pip install 'iceberg-row-lineage[plot]'); "
                        "--plot out.html or out.svg need nothing extra"
                    ) from None
            return {".html": "html", ".htm": "html", ".svg": "svg", ".png": "png"}[suffix]
    raise InvalidArgumentError(f"--plot must name a .html, .svg or .png file, got {path!r}")


def write_plot(history: History, path: str, scale: str = "log") -> str:
    """Draw ``history`` to ``path`` (.html, .svg or .png); returns the kind written."""
    kind = check_plot_path(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    if kind == "png":
        _png(history, path, scale)
    elif kind == "svg":
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(svg(history, scale))
    else:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(html_report(history, scale))
    return kind


# ---------------------------------------------------------------- SVG


def _nice_ticks(top: float, scale: str) -> list[float]:
    if scale == "log":
        ticks = [0.0, 1.0]
        while ticks[-1] < top:
            ticks.append(ticks[-1] * 10)
        return ticks
    if top <= 0:
        return [0.0, 1.0]
    step = 10 ** math.floor(math.log10(top))
    for m in (1, 2, 5, 10):
        if top / (step * m) <= 6:
            step *= m
            break
    return [i * step for i in range(int(top // step) + 2)]


def _fmt_count(n: float) -> str:
    n = int(n)
    for div, unit in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n:,}"


def svg(history: History, scale: str = "log") -> str:
    """The chart as a standalone SVG document."""
    if scale not in ("log", "linear"):
        raise InvalidArgumentError(f"--plot-scale must be log or linear, got {scale!r}")
    commits = list(history.commits)
    n = max(len(commits), 1)
    left, right, top, bottom = 70, 20, 64, 72
    plot_w = min(1600, max(640, n * 24))
    plot_h = 300
    width, height = left + plot_w + right, top + plot_h + bottom
    slot = plot_w / n
    peak = max([max(c.inserted, c.updated, c.deleted) for c in commits] + [1])
    ticks = _nice_ticks(peak, scale)
    y_top = ticks[-1] if scale == "linear" else math.log10(ticks[-1]) + 1

    def y_of(v: float) -> float:
        frac = (v / y_top) if scale == "linear" else ((math.log10(v) + 1) / y_top if v > 0 else 0.0)
        return top + plot_h - frac * plot_h

    def x_of(index: int) -> float:
        return left + index * slot

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="15" font-weight="bold">'
        f"{html.escape(history.table)}: rows changed per version</text>",
    ]
    # retention window: versions whose changes a feed can still return (> oldest)
    index_of = {c.version: i for i, c in enumerate(commits)}
    first_in = next((i for i, c in enumerate(commits) if c.version > history.oldest), None)
    if first_in is None:
        out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#eeeeee"/>')
    else:
        if first_in > 0:
            out.append(
                f'<rect x="{left}" y="{top}" width="{x_of(first_in) - left:.1f}" height="{plot_h}" fill="#eeeeee">'
                f"<title>outside the change-feed retention window (versions up to {history.oldest})</title></rect>"
            )
        out.append(
            f'<rect x="{x_of(first_in):.1f}" y="{top}" width="{left + plot_w - x_of(first_in):.1f}" height="{plot_h}" '
            f'fill="#fff6d6"><title>change feed available: ranges may start at version {history.oldest} or later</title></rect>'
        )
        out.append(
            f'<line x1="{x_of(first_in):.1f}" y1="{top - 6}" x2="{x_of(first_in):.1f}" y2="{top + plot_h}" stroke="#c99a00" '
            'stroke-width="1.5" stroke-dasharray="5,3"/>'
        )
        label_x = min(x_of(first_in) + 4, left + plot_w - 230)
        out.append(
            f'<text x="{label_x:.1f}" y="{top - 10}" fill="#8a6a00">CDF retention window: changes after v{history.oldest}</text>'
        )
    # versions that still have a snapshot (time travel)
    snaps = [index_of[v] for v in history.snapshots if v in index_of]
    if snaps:
        x0 = x_of(min(snaps))
        out.append(
            f'<rect x="{x0:.1f}" y="{top + plot_h + 26}" width="{left + plot_w - x0:.1f}" height="4" fill="#888">'
            f"<title>snapshots kept: scan --as-of works for versions "
            f"{min(history.snapshots)}..{max(history.snapshots)}</title></rect>"
        )
    # grid and y axis
    for t in ticks:
        y = y_of(t)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#dddddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#444">{_fmt_count(t)}</text>')
    out.append(
        f'<text x="16" y="{top + plot_h / 2}" transform="rotate(-90 16 {top + plot_h / 2})" text-anchor="middle" fill="#444">'
        f"rows ({scale} scale)</text>"
    )
    # bars
    bar_w = max(slot * 0.8 / 3, 0.6)
    for i, c in enumerate(commits):
        x = x_of(i) + slot * 0.1
        when = _dt.datetime.strftime(c.timestamp, "%Y-%m-%d %H:%M:%S") if c.timestamp else ""
        for j, (field, color, label) in enumerate(SERIES):
            v = getattr(c, field)
            if v <= 0:
                continue
            y = y_of(v)
            out.append(
                f'<rect x="{x + j * bar_w:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{top + plot_h - y:.1f}" fill="{color}">'
                f"<title>v{c.version} {html.escape(c.operation)} ({when} UTC): {v:,} {label}</title></rect>"
            )
        if c.operation not in ROW_OPERATIONS or not (c.inserted or c.updated or c.deleted):
            cx = x_of(i) + slot / 2
            out.append(
                f'<path d="M{cx - 4:.1f},{top + plot_h - 1} L{cx + 4:.1f},{top + plot_h - 1} L{cx:.1f},{top + plot_h - 9} Z" '
                f'fill="#777"><title>v{c.version} {html.escape(c.operation)} ({when} UTC): no row changes</title></path>'
            )
    # x axis
    out.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#444"/>')
    every = max(1, math.ceil(n / (plot_w / 28)))
    for i, c in enumerate(commits):
        if i % every == 0 or i == n - 1:
            out.append(
                f'<text x="{x_of(i) + slot / 2:.1f}" y="{top + plot_h + 18}" text-anchor="middle" fill="#444">{c.version}</text>'
            )
    out.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h + 46}" text-anchor="middle" fill="#444">version</text>')
    # legend
    lx = left
    ly = top + plot_h + 64
    for _, color, label in SERIES:
        out.append(
            f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{color}"/><text x="{lx + 14}" y="{ly}">{label}</text>'
        )
        lx += 80
    out.append(
        f'<path d="M{lx},{ly} L{lx + 8},{ly} L{lx + 4},{ly - 8} Z" fill="#777"/><text x="{lx + 13}" y="{ly}">maintenance</text>'
    )
    lx += 100
    out.append(
        f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="#fff6d6" stroke="#c99a00"/>'
        f'<text x="{lx + 14}" y="{ly}">CDF retention window</text>'
    )
    lx += 160
    out.append(
        f'<rect x="{lx}" y="{ly - 6}" width="10" height="4" fill="#888"/><text x="{lx + 14}" y="{ly}">snapshots kept</text>'
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def html_report(history: History, scale: str = "log") -> str:
    """A standalone HTML page: summary, the SVG chart and the commit log."""
    kept = set(history.snapshots)
    out_class = ' class="out"'
    rows = "\n".join(
        f"<tr{out_class if c.version <= history.oldest else ''}><td>{c.version}</td>"
        f"<td>{_dt.datetime.strftime(c.timestamp, '%Y-%m-%d %H:%M:%S')}</td><td>{html.escape(c.operation)}</td>"
        f"<td>{c.inserted:,}</td><td>{c.updated:,}</td><td>{c.deleted:,}</td>"
        f"<td>{'yes' if c.version in kept else 'expired'}</td></tr>"
        for c in history.commits
    )
    title = html.escape(history.table)
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}: lineage history</title>
<style>
body {{ font-family: Helvetica, Arial, sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; margin-top: 16px; }}
td, th {{ padding: 2px 10px; border-bottom: 1px solid #eee; text-align: right; }}
td:nth-child(2), td:nth-child(3), th {{ text-align: left; }}
tr.out td {{ color: #999; }}
.facts td {{ text-align: left; border: none; }}
</style></head><body>
<h2>{title}</h2>
<table class="facts">
<tr><td>current version</td><td>{history.current}</td></tr>
<tr><td>change-feed retention</td><td>{html.escape(history.retention)}</td></tr>
<tr><td>oldest available CDF start</td>
<td>version {history.oldest} (changes of versions {history.oldest + 1}..{history.current})</td></tr>
<tr><td>snapshots kept (time travel)</td><td>{_ranges(history.snapshots)}</td></tr>
<tr><td>generated</td><td>{generated}</td></tr>
</table>
{svg(history, scale)}
<table><tr><th>version</th><th>committed at (UTC)</th><th>operation</th>
<th>inserted</th><th>updated</th><th>deleted</th><th>snapshot</th></tr>
{rows}
</table>
<p style="color:#777">Grey rows are outside the change-feed retention window.</p>
</body></html>
"""


def _ranges(versions: Sequence[int]) -> str:
    vs = sorted(set(versions))
    if not vs:
        return "none"
    out, start, prev = [], vs[0], vs[0]
    for v in vs[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}..{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


# ---------------------------------------------------------------- PNG


def _png(history: History, path: str, scale: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    commits = list(history.commits)
    xs = list(range(len(commits)))
    from matplotlib.ticker import FixedLocator, FuncFormatter

    fig, ax = plt.subplots(figsize=(max(8.5, min(22.0, 2.0 + len(commits) * 0.35)), 4.2), dpi=110)
    first_in = next((i for i, c in enumerate(commits) if c.version > history.oldest), None)
    if first_in is None:
        ax.axvspan(-0.5, len(commits) - 0.5, color="#eeeeee", zorder=0)
    else:
        if first_in > 0:
            ax.axvspan(-0.5, first_in - 0.5, color="#eeeeee", zorder=0, label="outside retention window")
        ax.axvspan(
            first_in - 0.5, len(commits) - 0.5, color="#fff6d6", zorder=0, label=f"CDF retention window (after v{history.oldest})"
        )
        ax.axvline(first_in - 0.5, color="#c99a00", linestyle="--", linewidth=1)
    w = 0.8 / 3
    for j, (field, color, label) in enumerate(SERIES):
        ax.bar(
            [x - 0.4 + w * (j + 0.5) for x in xs],
            [getattr(c, field) for c in commits],
            width=w,
            color=color,
            label=label,
            zorder=2,
        )
    maint = [i for i, c in enumerate(commits) if c.operation not in ROW_OPERATIONS or not (c.inserted or c.updated or c.deleted)]
    if maint:
        ax.scatter(maint, [0] * len(maint), marker="^", color="#777", zorder=3, label="maintenance", clip_on=False)
    peak = max([max(c.inserted, c.updated, c.deleted) for c in commits] + [1])
    ticks = _nice_ticks(peak, scale)
    if scale == "log":
        ax.set_yscale("symlog", linthresh=1, linscale=0.5)
        ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.set_ylim(0, ticks[-1] * (1.6 if scale == "log" else 1.05))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _fmt_count(v)))
    step = max(1, math.ceil(len(commits) / 40))
    ax.set_xticks(xs[::step], [str(c.version) for c in commits][::step])
    ax.set_xlim(-0.5, len(commits) - 0.5)
    ax.set_xlabel("version")
    ax.set_ylabel(f"rows ({scale} scale)")
    ax.set_title(f"{history.table}: rows changed per version (snapshots kept: {_ranges(history.snapshots)})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="y", color="#dddddd", zorder=1)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
