"""Sections of benchmarks/report.py that the documentation site's pages show (see report.py for the mechanism).

* ``cdc-strategies``: the position and the equality change-stream strategies side by side, and CONVERT, from
  the newest ``cdc.py`` record that ran both;
* ``cdc-v3``: the change stream on Iceberg v2 and v3 side by side (and the time per phase of a commit, when the
  record has it), from the newest ``cdc.py`` record that ran both;
* ``run-v3``: the ``run.py`` workload on Iceberg v2 and v3 side by side, from the newest ``run.py`` record of each
  scale that ran both;
* ``append-overhead`` (table) and ``append-overhead-summary`` (one paragraph): ``append_overhead.py``;
* ``stream-upkeep``: ``stream_upkeep.py``, a change stream with and without ``maintain()``;
* ``reconcile``: ``reconcile.py``, reconciling one foreign Spark UPDATE against our own upsert of it.
"""

from __future__ import annotations

import statistics
from typing import Any

from report_base import EVEN, Records, fmt_s, latest_per_scale, load_words, md_table, missing, provenance, rows_label, section


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f}"


# --------------------------------------------------------------------------- cdc.py: the two strategies
def _both_strategies(d: dict[str, Any]) -> bool:
    names = {x["system"] for x in d["results"]["systems"] if "error" not in x}
    return {"lineage", "lineage-equality"} <= names


@section("cdc-strategies")
def _cdc_strategies(records: Records) -> str:
    doc = records.latest("cdc", where=_both_strategies)
    if doc is None:
        return missing("cdc.py with both strategies", "python benchmarks/cdc.py --systems lineage,lineage-equality --publish")
    r = doc["results"]
    by = {x["system"]: x for x in r["systems"]}
    pos, eq = by["lineage"], by["lineage-equality"]
    ex = eq.get("extras", {})
    rows = [[name, _ms(x["p50_ms"]), _ms(x["p99_ms"]), f"{x['bytes_per_commit']:,.0f}", fmt_s(x.get("feed_s")),
             fmt_s(x.get("extras", {}).get("scan_s", x.get("extras", {}).get("scan_before_s")))]
            for name, x in (("position", pos), ("equality", eq))]
    out = [provenance(doc), "",
           f"{r['commits']} commits of {r['events']:,} change events into a {rows_label(doc['scale'])}-row table "
           "(the equality strategy's feed time includes reconciling every commit on the first read):", "",
           md_table(["strategy", "commit p50 ms", "p99 ms", "bytes per commit", "feed s", "scan s"], rows), ""]
    said = [f"An equality commit took {_ms(eq['p50_ms'])} ms at the median against {_ms(pos['p50_ms'])} ms for the position "
            f"strategy, {pos['p50_ms'] / eq['p50_ms']:.2f}x cheaper."]
    if ex.get("reconcile_s") is not None:
        said.append(f"The first reader paid {fmt_s(ex['reconcile_s'] / eq['commits'])} s per commit to reconcile the "
                    f"{eq['commits']} equality commits ({fmt_s(ex['reconcile_s'])} s in all).")
    if ex.get("convert_s") is not None:
        said.append(f"CONVERT turned {ex['converted_equality_rows']:,} equality delete rows into {ex['converted_positions']:,} "
                    f"positions in {fmt_s(ex['convert_s'])} s; the scan then took {fmt_s(ex['scan_after_s'])} s "
                    f"(before: {fmt_s(ex['scan_before_s'])} s; the position strategy's table: "
                    f"{fmt_s(pos.get('extras', {}).get('scan_s'))} s), and the feed was "
                    + ("unchanged." if ex.get("feed_unchanged") else "CHANGED."))
    out.append(" ".join(said))
    return "\n".join(out)


# --------------------------------------------------------------------------- cdc.py: v2 against v3
V3_TARGETS = {"p50_ms": 40, "p99_ms": 100}  # the v3 change-stream commit's targets (1M rows, 2,000 events, 500 commits)
V3_COMMAND = "python benchmarks/cdc.py --systems lineage,lineage-v3 --phases --publish"
V3_PHASES = ("live_images_for_keys", "write_vectors", "write_merged_deletes", "_materialize_and_commit/write_data_files", "rewrite_kept",
             "build_lineage", "updates_and_requirements", "write_metadata", "swap_metadata")
V3_PHASE_NAMES = {"live_images_for_keys": "key lookup and live images", "write_vectors": "deletion vectors",
                  "write_merged_deletes": "position delete files", "_materialize_and_commit/write_data_files": "data files",
                  "rewrite_kept": "small files folded", "build_lineage": "lineage, index and key-index files",
                  "updates_and_requirements": "manifests and manifest list", "write_metadata": "metadata file",
                  "swap_metadata": "catalog"}


def _both_formats(d: dict[str, Any]) -> bool:
    names = {x["system"] for x in d["results"]["systems"] if "error" not in x}
    return {"lineage", "lineage-v3"} <= names


def _phase_ms(x: dict[str, Any], name: str) -> float | None:
    """Mean ms per commit of the call paths ending in ``name`` (one or more phases: ``parent/phase``)."""
    paths = x.get("phases", {}).get("mean_ms", {})
    found = [ms for path, ms in paths.items() if ("/" + path).endswith("/" + name)]
    return sum(found) if found else None


@section("cdc-v3")
def _cdc_v3(records: Records) -> str:
    doc = records.latest("cdc", where=_both_formats)
    if doc is None:
        return missing("cdc.py with lineage and lineage-v3", V3_COMMAND)
    r = doc["results"]
    by = {x["system"]: x for x in r["systems"]}
    v2, v3 = by["lineage"], by["lineage-v3"]
    rows = [[name, f"{x['commits']}", _ms(x["p50_ms"]), _ms(x["p99_ms"]), _ms(x.get("cpu_p50_ms")), f"{x['bytes_per_commit']:,.0f}",
             f"{x['feed']['commits_exact']}/{x['feed']['commits']}" if x.get("feed") else "—"]
            for name, x in (("v2", v2), ("v3", v3))]
    out = [provenance(doc), "",
           f"{r['events']:,} change events per commit into a {rows_label(doc['scale'])}-row table, position strategy, "
           "no maintenance during the stream:", "",
           md_table(["format", "commits", "commit p50 ms", "p99 ms", "CPU p50 ms", "bytes per commit", "feed commits exact"], rows), ""]
    met = [f"{k.split('_')[0]} {_ms(v3[k])} ms ({'meets' if v3[k] <= t else 'misses'} the {t} ms target)" for k, t in V3_TARGETS.items()]
    ratio = v3["bytes_per_commit"] / v2["bytes_per_commit"]
    out.append(f"On v3: {' and '.join(met)}; {ratio:.2f}x the bytes per commit of v2.")
    if "phases" in v2 and "phases" in v3:
        prow = [[V3_PHASE_NAMES[p], _ms(_phase_ms(v2, p)), _ms(_phase_ms(v3, p))] for p in V3_PHASES
                if _phase_ms(v2, p) is not None or _phase_ms(v3, p) is not None]
        out += ["", "Mean wall time per commit of each phase (`--phases`: the phase's calls on the committing thread, including what it waits for):", "",
                md_table(["phase", "v2 ms", "v3 ms"], prow)]
    return "\n".join(out)


# --------------------------------------------------------------------------- run.py: the feed on v2 against v3
RUN_V3_COMMAND = "python benchmarks/run.py --systems lineage,lineage-capture,pyiceberg,delta,ducklake,lance,lineage-v3 --publish"
RUN_V3_GROUPS = ("all writes", "cdf (a) all", "cdf (b) last 5", "cdf (c) net")


def _ran_v3(d: dict[str, Any]) -> bool:
    t = d["results"]["summary"]["time_s"]
    return all(t[g].get("lineage") is not None and t[g].get("lineage-v3") is not None for g in RUN_V3_GROUPS)


@section("run-v3")
def _run_v3(records: Records) -> str:
    docs = latest_per_scale(records, "run", _ran_v3)
    if not docs:
        return missing("run.py with lineage and lineage-v3", RUN_V3_COMMAND)
    out = []
    for doc in docs:
        s, scale = doc["results"]["summary"], rows_label(doc["scale"])
        t, size = s["time_s"], s["table_bytes"]
        rows = [[g, fmt_s(t[g]["lineage"]), fmt_s(t[g]["lineage-v3"]), f"{t[g]['lineage-v3'] / t[g]['lineage']:.2f}x"] for g in RUN_V3_GROUPS]
        rows.append(["table on disk at the end, MB", f"{size['lineage'] / 1e6:,.1f}", f"{size['lineage-v3'] / 1e6:,.1f}",
                     f"{size['lineage-v3'] / size['lineage']:.2f}x"])
        rows += _kind_rows(s.get("bytes_by_kind") or {})
        live = s.get("live_bytes") or {}
        live_ratio = live["lineage-v3"] / live["lineage"] if live.get("lineage") and live.get("lineage-v3") else None
        if live_ratio is not None:
            rows.append(["data and deletes of the last snapshot, MB", f"{live['lineage'] / 1e6:,.1f}", f"{live['lineage-v3'] / 1e6:,.1f}",
                         f"{live_ratio:.2f}x"])
        slower = [g for g in RUN_V3_GROUPS[1:] if t[g]["lineage-v3"] > EVEN * t[g]["lineage"]]
        verdict = (f"On v3 the feed was slower than on v2 by more than {EVEN - 1:.0%} on {', '.join(slower)}"
                   if slower else f"On v3 no feed was slower than on v2 by more than {EVEN - 1:.0%}")
        bigger = size["lineage-v3"] / size["lineage"]
        cpu = _feed_cpu_ratios(doc)
        out += [provenance(doc), "", f"The workload of `benchmarks/run.py` at {scale} rows, seconds (ratio: v3 over v2):", "",
                md_table(["step", "v2", "v3", "v3/v2"], rows), "",
                f"{verdict}; the v3 table took {bigger:.2f}x the bytes of the v2 table on disk, history included"
                + (f", and its last snapshot reads {live_ratio:.2f}x the bytes of v2's." if live_ratio is not None else ".")
                + (f" Median CPU time of the feed calls (all threads), v3 over v2: {cpu}." if cpu else ""), ""]
    return "\n".join(out).rstrip()


def _feed_cpu_ratios(doc: dict[str, Any]) -> str | None:
    """v3/v2 ratios of the median CPU time of each feed's calls (records with ``calls_cpu_s``), else None."""
    systems = doc["results"]["systems"]
    parts = []
    for step, label in (("cdf_all", "(a)"), ("cdf_last5", "(b)"), ("cdf_net", "(c)")):
        med = []
        for name in ("lineage", "lineage-v3"):
            calls = next((st.get("calls_cpu_s") for st in systems[name].get("steps", []) if st["step"] == step), None)
            if not calls:
                return None
            med.append(statistics.median(calls))
        parts.append(f"{label} {med[1] / med[0]:.2f}x")
    return ", ".join(parts)


def _kind_rows(kinds: dict[str, dict[str, int]]) -> list[list[str]]:
    """Rows of the bytes on disk per kind of object on v2 and v3 (records that measured them: run.py's bytes_by_kind;
    delete files are position delete files on v2, deletion vectors on v3)."""
    v2, v3 = kinds.get("lineage"), kinds.get("lineage-v3")
    if not v2 or not v3:
        return []
    rows = []
    for kind in sorted(set(v2) | set(v3)):
        a, b = v2.get(kind, 0), v3.get(kind, 0)
        rows.append([f"- of which {kind}, MB", f"{a / 1e6:,.2f}", f"{b / 1e6:,.2f}", f"{b / a:.2f}x" if a else ""])
    return rows


# --------------------------------------------------------------------------- append_overhead.py
AO_NAMES = {"pyiceberg": "pyiceberg", "lineage-keyless": "ours, no key", "lineage-keyed": "ours, keyed (deferred build)",
            "lineage-keyed-eager": "ours, keyed, `defer-rows=0`"}
AO_COMMAND = "python benchmarks/append_overhead.py --rows 1000000 --repeat 3 --publish"


def _med(runs: list[dict[str, Any]], field: str, inner: str | None = None) -> float | None:
    vals = [(x[inner][field] if inner else x.get(field)) for x in runs]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def _ao_docs(records: Records) -> list[dict[str, Any]]:
    """The newest append_overhead record of each scale, smallest scale first."""
    return latest_per_scale(records, "append_overhead")


@section("append-overhead")
def _append_overhead(records: Records) -> str:
    docs = _ao_docs(records)
    if not docs:
        return missing("append_overhead.py", AO_COMMAND)
    parts = []
    for doc in docs:
        runs = doc["results"]["runs"]
        base = _med(runs.get("pyiceberg", []), "wall_s", "append") if runs.get("pyiceberg") else None
        base_rss = _med(runs.get("pyiceberg", []), "peak_rss_mb", "append") if runs.get("pyiceberg") else None
        rows = []
        for system, rs in runs.items():
            wall, cpu, rss = (_med(rs, f, "append") for f in ("wall_s", "cpu_s", "peak_rss_mb"))
            vs = "" if base is None or system == "pyiceberg" else f"{(wall - base) / base:+.0%}"
            rss_cell = f"{rss:,.0f} MB" if system == "pyiceberg" or base_rss is None else f"{rss / base_rss:.2f}x"
            first, later, look, per = (_med(rs, f) for f in ("first_upsert_s", "upsert_median_s", "lookup_median_s", "index_bytes_per_key"))
            rows.append([AO_NAMES.get(system, system), f"{fmt_s(wall)} ({fmt_s(cpu)})", vs, rss_cell,
                         "" if first is None else f"{first * 1e3:,.0f} ms", "" if later is None else f"{later * 1e3:,.0f} ms",
                         "" if look is None else f"{look * 1e3:.1f} ms", "" if per is None else f"{per:.1f}"])
        parts += [provenance(doc), "",
                  f"{rows_label(doc['scale'])} rows, medians of {doc['results']['repeat']} run(s); upserts of 1,000 keys:", "",
                  md_table(["system", "append s (CPU s)", "vs pyiceberg", "peak RSS", "first upsert", "later upserts",
                            "lookup of 1,000 keys", "index bytes/key"], rows), ""]
    return "\n".join(parts).rstrip("\n")


@section("append-overhead-summary")
def _append_overhead_summary(records: Records) -> str:
    docs = _ao_docs(records)
    if not docs:
        return missing("append_overhead.py", AO_COMMAND)
    said = []
    for doc in docs:
        runs = doc["results"]["runs"]
        keyed, eager = runs.get("lineage-keyed"), runs.get("lineage-keyed-eager")
        if not keyed:
            continue
        s = (f"At {rows_label(doc['scale'])} rows ({doc['date']}, {load_words(doc)}; `benchmarks/results/{doc['_file']}`) "
             f"a keyed bulk append took {fmt_s(_med(keyed, 'wall_s', 'append'))} s with the build deferred")
        if eager:
            s += f" and {fmt_s(_med(eager, 'wall_s', 'append'))} s with `defer-rows=0`"
        if runs.get("pyiceberg"):
            s += f" (plain pyiceberg: {fmt_s(_med(runs['pyiceberg'], 'wall_s', 'append'))} s)"
        first = _med(keyed, "first_upsert_s")
        if first is not None:
            s += (f"; the first 1,000-key upsert after it, which builds the index, took {first * 1e3:,.0f} ms"
                  + (f" ({_med(eager, 'first_upsert_s') * 1e3:,.0f} ms when the append had built it)" if eager and _med(eager, "first_upsert_s") else ""))
        said.append(s + ".")
    return " ".join(said) if said else missing("append_overhead.py with a keyed table", AO_COMMAND)


# --------------------------------------------------------------------------- stream_upkeep.py
@section("stream-upkeep")
def _stream_upkeep(records: Records) -> str:
    doc = records.latest("stream_upkeep")
    if doc is None:
        return missing("stream_upkeep.py", "python benchmarks/stream_upkeep.py --publish")
    r = doc["results"]
    w = r["window"]
    rows = [["never" if x["maintain_every"] == 0 else f"every {x['maintain_every']} commits", _ms(x["p50"]), _ms(x["first"]), _ms(x["last"]),
             _ms(x["p99"]), "—" if not x["maintain_runs"] else f"{x['maintain_runs']} runs, median {fmt_s(x['maintain_s'])} s"] for x in r["runs"]]
    return "\n".join([
        provenance(doc), "",
        f"{r['commits']} commits of 2,000 events into a {rows_label(doc['scale'])}-row table, commit times in ms:", "",
        md_table(["maintain()", "p50", f"first {w} p50", f"last {w} p50", "p99", "maintain()"], rows),
    ])


# --------------------------------------------------------------------------- reconcile.py
@section("reconcile")
def _reconcile(records: Records) -> str:
    docs = latest_per_scale(records, "reconcile")
    if not docs:
        return missing("reconcile.py", "python benchmarks/reconcile.py --rows 1000000 --publish")
    parts = []
    for doc in docs:
        rows = [[f"{rows_label(doc['scale'])}, {m['mode']}", fmt_s(m["reconcile_warm_s"]), fmt_s(m["reconcile_cold_s"]), fmt_s(m["upsert_s"]),
                 f"{m['reconcile_warm_s'] / m['upsert_s']:.1f}x"] for m in doc["results"]["modes"]]
        parts += [provenance(doc), "",
                  md_table(["Spark UPDATE of 1% of the rows", "reconcile, warm s", "reconcile, cold s", "our own upsert s", "ratio (warm)"], rows), ""]
    return "\n".join(parts).rstrip("\n")
