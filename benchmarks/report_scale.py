"""Sections of benchmarks/report.py for ``benchmarks/large.py`` (the scale page of the documentation site).

* ``large-steps``: per published size, each step's wall time and peak memory for our Spark path, our
  embedded engine and the reference engine, and how the run met the targets;
* ``large-growth``: what grows with the table, measured at each published size and extrapolated (a
  straight line through the two largest sizes) to 1 and 10 billion rows, and which of them reaches its
  limit first.
"""

from __future__ import annotations

from typing import Any

from report_base import Records, fmt_s, latest_per_scale, load_words, md_table, missing, provenance, rows_label, section

COMMAND = "python benchmarks/large.py --rows 10000000 --data-dir DIR --publish"
SYSTEM_NAMES = {"spark": "ours on Spark", "embedded": "ours embedded", "reference": "reference engine"}
STEPS = ("delete", "update", "upsert", "feed", "scan", "scan-16m")  # scan-16m: embedded, 16 MiB of Parquet per group
PYTHON_TARGET_MB = 1536  # every step's Python process under 1.5 GB
TARGETS = (1_000_000_000, 10_000_000_000)


def large_docs(records: Records) -> list[dict[str, Any]]:
    """The newest ``large`` record of each size, smallest first."""
    return latest_per_scale(records, "large")


def _by(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["system"], r["step"]): r for r in doc["results"]["steps"]}


def _mb(v: float | None) -> str:
    return "—" if not v else f"{v:,.0f}"


@section("large-steps")
def _large_steps(records: Records) -> str:
    docs = large_docs(records)
    if not docs:
        return missing("large.py", COMMAND)
    parts = []
    for doc in docs:
        by, r = _by(doc), doc["results"]
        systems = [s for s in SYSTEM_NAMES if any(k[0] == s for k in by)]
        rows = []
        for step in STEPS:
            for s in systems:
                x = by.get((s, step))
                if x is None:
                    continue
                rows.append([f"{step}, {SYSTEM_NAMES[s]}", fmt_s(x["wall_s"]), _mb(x.get("python_before_mb")), _mb(x["python_peak_mb"]), _mb(x["jvm_peak_mb"]),
                             _mb(x["workers_peak_mb"]), f"{x['bytes_written'] / 1e6:,.1f}"])
        b = r["build"]
        parts += [provenance(doc), "",
                  f"{rows_label(doc['scale'])} rows; the upsert batch has {b['upsert_rows']:,} rows ({b['upsert_existing']:,} of them "
                  f"keys the table has); live rows after the three commits: "
                  + ", ".join(f"{SYSTEM_NAMES.get(k, k)} {v:,}" for k, v in r["live_rows"].items())
                  + (" (they agree, and so do the sums of `amount` and the feeds' row counts)." if r["agree"] else " (THEY DIFFER)."), "",
                  md_table(["step, system", "wall s", "Python at start MB", "Python peak MB", "JVM peak MB", "Spark Python workers MB", "MB written"], rows), "",
                  _targets(doc), ""]
    return "\n".join(parts).rstrip("\n")


def _targets(doc: dict[str, Any]) -> str:
    """Sentences on the targets: Python peak RSS under 1.5 GB, Spark writes no slower than the reference engine."""
    by = _by(doc)
    ours = [x for x in doc["results"]["steps"] if x["system"] in ("spark", "embedded")]
    top = max(ours, key=lambda x: x["python_peak_mb"]) if ours else None
    said = []
    if top is not None:
        verdict = "under" if top["python_peak_mb"] < PYTHON_TARGET_MB else "OVER"
        said.append(f"The largest Python peak of our steps was {top['python_peak_mb']:,.0f} MB ({top['step']}, "
                    f"{SYSTEM_NAMES[top['system']]}), {verdict} the 1.5 GB target.")
    compared = []
    for step in ("delete", "update", "upsert"):
        a, b = by.get(("spark", step)), by.get(("reference", step))
        if a and b:
            ratio = a["wall_s"] / b["wall_s"]
            compared.append(f"{step} {fmt_s(a['wall_s'])} s against {fmt_s(b['wall_s'])} s ("
                            + (f"{ratio:.1f}x slower)" if ratio >= 1 else f"{1 / ratio:.1f}x faster)"))
    if compared:
        said.append("Ours on Spark against the reference engine's merge-on-read DELETE, UPDATE and MERGE: " + "; ".join(compared) + ".")
    return " ".join(said)


# --------------------------------------------------------------------------- what grows with the table
def growth(doc: dict[str, Any]) -> dict[str, float]:
    """The quantities that grow with the table, in bytes (or files, or MB of memory), from one record."""
    r = doc["results"]
    sizes, plan = r["build"]["sizes"], r["build"].get("planning", {})
    by = _by(doc)
    written = [x for x in r["steps"] if x["system"] == "embedded"]

    def wrote(kind: str) -> float:
        return float(sum(x.get("written", {}).get(kind, {}).get("bytes", 0) for x in written))

    out = {
        "data bytes": float(sizes["data"]["bytes"]),
        "manifest files": float(sizes["manifests"]["files"]),
        "manifest bytes": float(sizes["manifests"]["bytes"] + sizes["manifest_lists"]["bytes"]),
        "lineage segment bytes": float(sizes["lineage_segments"]["bytes"]),
        "key index bytes": float(sizes["key_index"]["bytes"]),
        "lineage segment bytes written by the 3 commits": wrote("lineage_segments"),
        "deleted-rows index bytes written by the 3 commits": wrote("deleted_rows_index"),
        "position delete bytes written by the 3 commits": wrote("position_deletes"),
        "driver planning memory MB": float(plan.get("plan_grew_mb", 0.0)),
        "driver planning + key index memory MB": float(plan.get("with_key_index_grew_mb", 0.0)),
    }
    rebuild = r["build"].get("reindex", {})
    if "peak_mb" in rebuild:
        out["key index rebuild (reindex), peak RSS MB"] = float(rebuild["peak_mb"])
        out["key index rebuild (reindex) seconds"] = float(rebuild["seconds"])
    base = _baseline(doc)
    for system in ("embedded", "spark"):
        held = None  # what the process held after the previous step
        for step in STEPS:
            x = by.get((system, step))
            if x is not None and x.get("python_before_mb") is not None:
                # from the previous step's end: records made before large.py planned the Spark feed inside its step
                # have that plan in the feed step's start
                start = x["python_before_mb"] if held is None else min(x["python_before_mb"], held)
                grew = max(0.0, x["python_peak_mb"] - start)
                out[f"Python, {SYSTEM_NAMES[system]}, {step}: start + growth in the step MB"] = base + grew
                if x.get("python_after_anon_mb") is not None:
                    held = x["python_after_anon_mb"] + x.get("python_after_file_mb", 0.0)
    return out


def _baseline(doc: dict[str, Any]) -> float:
    """The driving process's RSS before its first step (interpreter, imports, the table opened)."""
    firsts = [x["python_before_mb"] for x in doc["results"]["steps"] if x.get("python_before_mb") is not None]
    return float(firsts[0]) if firsts else 0.0


# Memory a step holds by design whatever the table's size: a scan holds one group of files at a time; a key
# index rebuild past its memory budget (lineage.key-index.build-memory-bytes) spills hash ranges to disk and
# holds the budget plus one group of files (below the budget, as at 1M rows, it builds in memory).
BOUNDED = ("ours embedded, scan:", "ours embedded, scan-16m:", "key index rebuild (reindex), peak RSS")


def extrapolate(points: list[tuple[int, float]], rows: int, memory: bool = False) -> float:
    """The value at ``rows`` on the line through the two largest measured points (at least two). When the value fell
    between them: memory (``memory``) stays where it is; sizes of files go through the origin and the largest point
    (manifests or segments merged in between: a line through both would go negative, one through the origin grows
    as the count of files does)."""
    (n1, v1), (n2, v2) = points[-2], points[-1]
    if v2 >= v1:
        slope = (v2 - v1) / (n2 - n1)
    else:
        slope = 0.0 if memory else v2 / n2
    return v2 + slope * (rows - n2)


def _fmt(name: str, v: float) -> str:
    if "bytes" in name:
        return f"{v / 1e9:,.2f} GB" if v >= 1e9 else (f"{v / 1e6:,.1f} MB" if v >= 1e6 else f"{v / 1e3:,.1f} kB")
    if name.endswith("seconds"):
        return f"{v:,.1f} s"
    if name.endswith("MB"):
        return f"{v / 1024:,.1f} GB" if v >= 1024 else f"{v:,.0f} MB"
    return f"{v:,.0f}"


@section("large-growth")
def _large_growth(records: Records) -> str:
    docs = large_docs(records)
    if not docs:
        return missing("large.py", COMMAND)
    measured = [(d["scale"], growth(d)) for d in docs]
    names = list(measured[-1][1])
    rows, limits, over = [], [], []
    machine_mb = float(docs[-1]["machine"]["memory_gib"] or 0) * 1024
    for name in names:
        points = [(n, g[name]) for n, g in measured if name in g]
        bounded = any(b in name for b in BOUNDED)
        if bounded:
            ahead = ["bounded †"] * len(TARGETS)
        else:
            ahead = [_fmt(name, extrapolate(points, t, name.endswith("MB"))) + " *" if len(points) >= 2 else "—" for t in TARGETS]
        rows.append([name + (" †" if bounded else ""), *(_fmt(name, v) for _, v in points), *ahead])
        if not name.endswith("MB"):
            continue
        if points[-1][1] >= PYTHON_TARGET_MB:
            over.append(f"{name.removesuffix(' MB')} ({_fmt(name, points[-1][1])} at {rows_label(points[-1][0])} rows)")
        if len(points) >= 2 and not bounded:
            slope = (points[-1][1] - points[-2][1]) / (points[-1][0] - points[-2][0])
            if slope > 0:
                limits.append((points[-1][0] + (PYTHON_TARGET_MB - points[-1][1]) / slope,
                               points[-1][0] + (machine_mb - points[-1][1]) / slope, name))
    headers = ["grows with the table", *(f"{rows_label(n)} rows" for n, _ in measured), *(f"{t // 1_000_000_000}B rows *" for t in TARGETS)]
    out = [f"Measured at {', '.join(rows_label(n) for n, _ in measured)} rows (records: "
           + ", ".join(f"`benchmarks/results/{d['_file']}`, {load_words(d).split(':')[0]}" for d in docs)
           + "); columns marked * are extrapolated along the line through the two largest measured sizes (through the origin "
           "and the largest size where a size of files fell between them, as manifests and lineage segments do when merged; "
           "flat where memory fell). "
           "The Python rows are the driving process's memory before its first step plus what the step added; "
           "rows marked † hold one group of files at a time (the key-index rebuild also its memory budget), so they "
           "stop growing once a group is full.", "",
           md_table(headers, rows)]
    said = []
    if limits:
        at, machine_at, name = min(limits)
        said.append(f"Of the figures that grow without a bound in one Python process, **{name.removesuffix(' MB')}** reaches "
                    f"the 1.5 GB target first, at about {_rows_words(max(at, 0))} rows on this line, and this machine's "
                    f"{machine_mb / 1024:.1f} GiB at about {_rows_words(machine_at)} rows.")
    if over:
        said.append("Over 1.5 GB already at a measured size: " + "; ".join(over) + ".")
    if said:
        out += ["", " ".join(said)]
    return "\n".join(out)


def _rows_words(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:,.1f} billion"
    return f"{n / 1e6:,.0f} million"
