"""Sections of benchmarks/report.py for the other benchmarks: write cost, Spark, maintenance, scaling, MV refresh, expression guard, key index, CDC ingest, long histories, following the feed."""

from __future__ import annotations

from statistics import median
from typing import Any

from report_base import (
    NAMES,
    Records,
    and_join,
    fmt_int,
    fmt_s,
    load_words,
    mb,
    md_table,
    missing,
    provenance,
    rows_label,
    section,
    versus,
)

# --------------------------------------------------------------------------- write_cost.py
WRITE_SCENARIOS = ("lineage update, merge-on-read", "lineage update, copy-on-write",
                   "pyiceberg overwrite(filter), copy-on-write", "pyiceberg upsert(join_cols), copy-on-write")
SHORT_SCENARIO = dict(zip(WRITE_SCENARIOS, ("our merge-on-read", "our copy-on-write", "pyiceberg's overwrite", "pyiceberg's upsert")))


def _files(r: dict[str, Any]) -> str:
    k = r["by_kind"]
    parts = [k.get(x, {}).get("files", 0) for x in ("data", "delete", "lineage", "iceberg_metadata")]
    return f"{r['files_written']} ({' / '.join(map(str, parts))})"


def render_write_cost(doc: dict[str, Any]) -> str:
    """One write_cost.py record: the four scenarios' bytes, files and time, then the comparisons."""
    res = doc["results"]
    sc = {r["scenario"]: r for r in res["scenarios"]}
    timing = "wall s" if res["repeat"] == 1 else f"wall s (fastest of {res['repeat']})"
    rows = [[name, fmt_int(r["table_bytes"]), fmt_int(r["bytes_written"]), _files(r), fmt_s(r["wall_seconds"]), f"{r['ratio_written_to_table']:.2%}"]
            for name, r in sc.items()]
    mor, cow, ice = (sc[n] for n in WRITE_SCENARIOS[:3])
    touched = "every data file touched" if res["pattern"] == "scattered" else "one order_id range"
    out = [provenance(doc), "",
           f"{res['rows_updated']:,} of {doc['scale']:,} rows updated ({res['pattern']}: `{res['where']}`, {touched}):", "",
           md_table(["scenario", "table size", "bytes written", "files written (data / delete / lineage+index / Iceberg meta)", timing, "written / table"], rows, right={1, 2, 4, 5}),
           "", f"Merge-on-read wrote {mor['ratio_written_to_table']:.2%} of the table's bytes, copy-on-write {cow['ratio_written_to_table']:.2%}, "
               f"pyiceberg's overwrite {ice['ratio_written_to_table']:.2%}. Wall time: merge-on-read {fmt_s(mor['wall_seconds'])} s, "
               + ", ".join(versus(mor["wall_seconds"], sc[n]["wall_seconds"], SHORT_SCENARIO[n]) for n in WRITE_SCENARIOS[1:]) + "."]
    return "\n".join(out)


@section("write-cost")
def _write_cost(records: Records) -> str:
    out = []
    for pattern in ("scattered", "clustered"):
        doc = records.latest("write_cost", variant=pattern, scale=1_000_000)
        out.append(render_write_cost(doc) if doc else missing(f"write_cost.py --pattern {pattern}",
                                                              f"python benchmarks/write_cost.py --repeat 3 --pattern {pattern} --publish"))
    return "\n\n".join(out)


# --------------------------------------------------------------------------- spark_cdf.py and cdf_cost.py
@section("spark-cdf")
def _spark_cdf(records: Records) -> str:
    doc = records.latest("spark_cdf")
    if doc is None:
        return missing("spark_cdf.py", "python benchmarks/spark_cdf.py --rows 1000000 --publish")
    r = doc["results"]
    rows = []
    for key, label in (("per_version", "per-version"), ("net", "net")):
        x = r[key]
        same = "yes" if x["identical"] else f"NO ({x['only_duckdb']:,} rows only in DuckDB's, {x['only_spark']:,} only in Spark's)"
        rows.append([label, fmt_int(x["rows"]), fmt_s(x["duckdb_s"]), fmt_s(x["spark_s"]), f"{x['spark_s'] / x['duckdb_s']:.1f}x", same])
    pv = r["per_version"]
    return "\n".join([
        provenance(doc), "",
        f"{doc['scale']:,}-row table, change feed of versions ({r['range'][0]}, {r['range'][1]}]:", "",
        md_table(["feed", "rows", "DuckDB s", "Spark s", "Spark / DuckDB", "same rows, every column"], rows, right={1, 2, 3, 4}),
        "", (f"A full DuckDB scan of the table ({r['scan_rows']:,} rows) took {fmt_s(r['duckdb_full_scan_s'])} s, so the per-version feed "
            f"cost {pv['duckdb_s'] / r['duckdb_full_scan_s']:.2f} of a scan in DuckDB and {pv['spark_s'] / r['duckdb_full_scan_s']:.1f} in Spark."),
    ])


@section("cdf-cost")
def _cdf_cost(records: Records) -> str:
    doc = records.latest("cdf_cost")
    if doc is None:
        return missing("cdf_cost.py", "python benchmarks/cdf_cost.py --rows 1000000 --publish")
    r = doc["results"]
    rows = [["full scan", fmt_int(r["scan_rows"]), fmt_s(r["scan_s"]), "1.00"],
            ["change feed, per-version", fmt_int(r["feed_rows"]), fmt_s(r["cdf_s"]), f"{r['cdf_over_scan']:.2f}"],
            ["change feed, net", fmt_int(r["net_rows"]), fmt_s(r["cdf_net_s"]), f"{r['cdf_net_over_scan']:.2f}"]]
    return "\n".join([
        provenance(doc), "",
        (f"{doc['scale']:,} rows; the range holds the last {r['range_versions']} commits, {r['changed_rows_in_range']:,} changed rows "
        f"({r['changed_fraction']:.2%} of the table). Best of 3 runs:"), "",
        md_table(["read", "rows", "s", "of a scan"], rows),
        "", (f"The deleted-rows index took {r['index_bytes_per_removed_row']:.2f} bytes per removed row image "
            f"({r['removed_rows_indexed']:,} images)."),
    ])


# --------------------------------------------------------------------------- maintenance_report.py
KIND_LABELS = (("data", "data"), ("deletes", "delete"), ("iceberg-meta", "Iceberg metadata"), ("lineage", "lineage"), ("index", "index"))


@section("maintenance")
def _maintenance(records: Records) -> str:
    doc = records.latest("maintenance_report")
    if doc is None:
        return missing("maintenance_report.py", "python benchmarks/maintenance_report.py --publish")
    r = doc["results"]

    def cells(inv: dict[str, Any]) -> list[str]:
        d = inv["disk"]
        total_f, total_b = sum(v["files"] for v in d.values()), sum(v["bytes"] for v in d.values())
        s = inv["snapshot"]
        return [*(f"{d[k]['files']:,} / {d[k]['bytes']:,}" for k, _ in KIND_LABELS), f"{total_f:,} / {total_b:,}",
                f"{s['data']['files']:,} / {s['deletes']['files']:,}", str(inv["snapshots"]), str(inv["version"])]

    rows = [["(before maintenance)", "", *cells(r["initial"])]]
    rows += [[f"`{st['step']}`", fmt_s(st["wall_s"]), *cells(st["after"])] for st in r["steps"]]
    first, last = r["initial"]["disk"], r["steps"][-1]["after"]["disk"]
    before_b, after_b = sum(v["bytes"] for v in first.values()), sum(v["bytes"] for v in last.values())
    before_f, after_f = sum(v["files"] for v in first.values()), sum(v["files"] for v in last.values())
    same = "identical" if all(r["unchanged"].values()) else "DIFFERENT: " + ", ".join(k for k, v in r["unchanged"].items() if not v)
    fb, fa = r["fingerprint_before"], r["fingerprint_after"]
    return "\n".join([
        provenance(doc), "",
        f"{doc['scale']:,} rows, then {r['commits']} small commits. Cells are files / bytes on disk after the step.", "",
        md_table(["after step", "wall s", *(label for _, label in KIND_LABELS), "total", "snapshot: data / delete files", "snapshots", "version"], rows),
        "", (f"On disk: {before_b / 1e6:.1f} MB in {before_f:,} files before, {after_b / 1e6:.1f} MB in {after_f:,} files after. "
            f"Scan and change feed before and after all the operations: {same}; the feed took {fb['feed_wall_s']} s before and "
            f"{fa['feed_wall_s']} s after."),
    ])


# --------------------------------------------------------------------------- scaling.py
@section("scaling")
def _scaling(records: Records) -> str:
    doc = records.latest("scaling")
    if doc is None:
        return missing("scaling.py", "python benchmarks/scaling.py --publish")
    r = doc["results"]
    out = [provenance(doc)]
    size = r.get("by_table_size") or []
    if size:
        rows = [[fmt_int(x["rows"]), str(x["live_files"]), f"{x['feed_s']:.3f}", f"{x['net_s']:.3f}", f"{x['pointers_s']:.3f}", f"{x['values_s']:.3f}",
                 str(x["files_read_for_values"]), fmt_int(x["index_bytes"]), f"{x['index_bytes'] / max(1, x['removed_images']):.1f}",
                 f"{sum(x['change_commit_s']) / max(1, len(x['change_commit_s'])):.2f}", f"{x['load1']:g}"] for x in size]
        a, z = size[0], size[-1]
        out += ["", f"Series 1, the table grows ({fmt_int(a['feed_rows'])} feed rows at every size):", "",
                md_table(["table rows", "data files", "feed s", "net s", "pointers s", "values s", "files read for values", "index bytes",
                          "bytes per removed image", "change commit s (mean)", "load"], rows)]
        if len(size) > 1:
            out += ["", (f"{z['rows'] / a['rows']:g} times the rows cost {z['feed_s'] / a['feed_s']:.2f} times the feed time "
                        f"({a['feed_s']:.3f} s to {z['feed_s']:.3f} s; values {a['values_s']:.3f} s to {z['values_s']:.3f} s, "
                        f"pointers {a['pointers_s']:.3f} s to {z['pointers_s']:.3f} s).")]
    vol = r.get("by_change_volume") or []
    if vol:
        rows = [[str(x["commits_in_range"]), fmt_int(x["removed_images"]), fmt_int(x["feed_rows"]), f"{x['feed_s']:.3f}", f"{x['net_s']:.3f}",
                 f"{x['pointers_s']:.3f}", f"{x['values_s']:.3f}", fmt_int(x["index_bytes"]), f"{x['index_bytes'] / max(1, x['removed_images']):.1f}",
                 f"{x['load1']:g}"] for x in vol]
        a, z = vol[0], vol[-1]
        out += ["", f"Series 2, the change volume grows (table of {fmt_int(a['table_rows'])} rows):", "",
                md_table(["commits in range", "removed images", "feed rows", "feed s", "net s", "pointers s", "values s", "index bytes",
                          "bytes per removed image", "load"], rows)]
        if len(vol) > 1:
            out += ["", (f"{z['feed_rows'] / a['feed_rows']:g} times the feed rows cost {z['feed_s'] / a['feed_s']:.2f} times the feed time "
                        f"({a['feed_s']:.3f} s to {z['feed_s']:.3f} s).")]
    return "\n".join(out)


# --------------------------------------------------------------------------- mv_refresh.py
def _mv_doc(records: Records) -> dict[str, Any] | None:
    return records.latest("mv_refresh", variant=None)


@section("mv-refresh")
def _mv_refresh(records: Records) -> str:
    doc = _mv_doc(records)
    if doc is None:
        return missing("mv_refresh.py", "python benchmarks/mv_refresh.py --publish")
    r = doc["results"]
    rows, words = [], []
    for rnd in r["rounds"]:
        for view in r["views"]:
            v = rnd[view]
            inc = v["incremental"]
            change = f"{inc['inserted']:,} / {inc['updated']:,} / {inc['deleted']:,}" + (f", {inc['groups_recomputed']} groups recomputed" if inc["groups_recomputed"] else "")
            rows.append([str(rnd["round"]), f"`{view}`", fmt_s(v["incremental_s"]), fmt_s(v["full_refresh_s"]), fmt_s(v["query_only_s"]),
                         fmt_int(v["view_rows"]), change, "yes" if v["identical"] else "NO"])
            words.append(f"round {rnd['round']} `{view}`: incremental {fmt_s(v['incremental_s'])} s, "
                         + versus(v["incremental_s"], v["full_refresh_s"], "the full refresh"))
    builds = {k[len("initial_build_"):-2]: v for k, v in r.items() if k.startswith("initial_build_")}
    return "\n".join([
        provenance(doc), "",
        f"{doc['scale']:,}-row source, {r['percent']:g}% of it changed per round in 3 commits. Initial builds: "
        + ", ".join(f"`{k}` {fmt_s(v)} s" for k, v in builds.items()) + ".", "",
        md_table(["round", "view", "incremental s", "full refresh s", "query alone s", "view rows", "incremental: ins / upd / del", "views identical"], rows,
                 right={2, 3, 4, 5}),
        "", "In words: " + "; ".join(words) + ".",
    ])


@section("readme-mv-refresh")
def _readme_mv(records: Records) -> str:
    doc = _mv_doc(records)
    if doc is None:
        return missing("mv_refresh.py", "python benchmarks/mv_refresh.py --publish")
    r = doc["results"]

    def span(view: str, key: str) -> str:
        vals = [rnd[view][key] for rnd in r["rounds"]]
        return fmt_s(min(vals)) + ("" if len(vals) == 1 else f" to {fmt_s(max(vals))}") + " s"

    proj_rows = r["rounds"][-1]["proj"]["view_rows"]

    def faster(view: str) -> str:
        inc = sum(rnd[view]["incremental_s"] < rnd[view]["full_refresh_s"] for rnd in r["rounds"])
        n = len(r["rounds"])
        return "incremental" if inc == n else "full" if inc == 0 else "mixed"

    verdict = {v: faster(v) for v in ("proj", "agg", "sums")}
    words = {"incremental": "the incremental refresh was faster", "full": "the full refresh was faster",
             "mixed": "neither was faster in every round"}
    return (f"Measured ({doc['date']}, {load_words(doc)}): with {r['percent']:g}% of a {rows_label(doc['scale'])}-row source changed (scattered), "
            f"a {proj_rows:,}-row projection view refreshed incrementally in {span('proj', 'incremental_s')} against "
            f"{span('proj', 'full_refresh_s')} for a full refresh; a 1,000-group aggregate view with MIN/MAX took {span('agg', 'incremental_s')} "
            f"against {span('agg', 'full_refresh_s')}, and without MIN/MAX {span('sums', 'incremental_s')} against {span('sums', 'full_refresh_s')}. "
            f"In every round of this run: projection, {words[verdict['proj']]}; aggregate with MIN/MAX, {words[verdict['agg']]}; "
            f"aggregate without, {words[verdict['sums']]} (`benchmarks/results/{doc['_file']}`).")


# --------------------------------------------------------------------------- expression_guard.py
@section("expression-guard")
def _expression_guard(records: Records) -> str:
    doc = records.latest("expression_guard")
    if doc is None:
        return missing("expression_guard.py", "python benchmarks/expression_guard.py --publish")
    r = doc["results"]
    rows = [[op, fmt_s(v["sealed_s"]), fmt_s(v["unsealed_s"]), f"{v['ratio']:.2f}"] for op, v in r["ops"].items()]
    worst = max(v["ratio"] for v in r["ops"].values())
    return "\n".join([
        provenance(doc), "",
        f"{doc['scale']:,} rows, {doc['settings']['repeat']} rounds alternating sealed and unsealed; medians:", "",
        md_table(["call", "sealed s", "unsealed s", "ratio"], rows),
        "", (f"The largest sealed/unsealed ratio is {worst:.2f}. Checking one predicate took {r['check_cold_ms']:g} ms cold "
             f"and {r['check_cached_us']:g} us when cached (median of 50)."),
    ])
# --------------------------------------------------------------------------- key_index.py
def _key_index_doc(records: Records) -> dict[str, Any] | None:
    return records.latest("key_index")


def _ms(v: float) -> str:
    return f"{v * 1000:,.0f}"


def _with_cpu(x: dict[str, Any], what: str) -> str:
    """A time in seconds, with its CPU seconds in brackets where the record has them (a loaded machine inflates wall time)."""
    cpu = x.get(f"{what}_cpu_s")
    return fmt_s(x[f"{what}_s"]) + (f" (CPU {fmt_s(cpu)})" if cpu is not None else "")


@section("key-index")
def _key_index(records: Records) -> str:
    doc = _key_index_doc(records)
    if doc is None:
        return missing("key_index.py", "python benchmarks/key_index.py --publish")
    r = doc["results"]
    rows = [[fmt_int(x["rows"]), f"{_ms(median(x['before_s']))} ({_ms(min(x['before_s']))})", f"{_ms(median(x['after_s']))} ({_ms(min(x['after_s']))})",
             f"{median(x['lookup_s']) * 1000:.1f}", _with_cpu(x, "build_in_memory"), _with_cpu(x, "reindex_commit"), mb(x["index_bytes"]),
             f"{x['index_bytes_per_key']:g}", f"{x['resident_bytes_per_key']:g}" if "resident_bytes_per_key" in x else "-"] for x in r["sizes"]]
    out = [provenance(doc), "",
           f"An upsert of {r['keys']:,} rows (half updates of random live keys, half inserts), {r['repeat']} times per table and mode; "
           "milliseconds, median (fastest):", "",
           md_table(["table rows", "upsert, key scan (index off)", "upsert, key index", f"lookup of {r['keys']:,} keys, ms", "build in memory, s",
                     "reindex commit, s", "index size", "bytes per key", "resident bytes per key"], rows)]
    if len(r["sizes"]) > 1:
        a, z = r["sizes"][0], r["sizes"][-1]
        grow = z["rows"] / a["rows"]
        before = median(z["before_s"]) / median(a["before_s"])
        after = median(z["after_s"]) / median(a["after_s"])
        out += ["", (f"{grow:g} times the rows made the upsert {before:.2f} times slower with the key scan and {after:.2f} times "
                     f"with the key index (medians); at {rows_label(z['rows'])} rows the index made it "
                     f"{median(z['before_s']) / median(z['after_s']):.1f}x faster.")]
    return "\n".join(out)


@section("readme-key-index")
def _readme_key_index(records: Records) -> str:
    doc = _key_index_doc(records)
    if doc is None:
        return missing("key_index.py", "python benchmarks/key_index.py --publish")
    r = doc["results"]
    parts = [f"{rows_label(x['rows'])} rows {_ms(median(x['after_s']))} ms (with the key scan {_ms(median(x['before_s']))} ms)"
             for x in r["sizes"]]
    big = r["sizes"][-1]
    return (f"An upsert of {r['keys']:,} keys (half updates, half inserts) took, median of {r['repeat']}: {and_join(parts)}. Building the index "
            f"of {rows_label(big['rows'])} rows (`reindex`) took {fmt_s(big['reindex_commit_s'])} s; it holds {mb(big['index_bytes'])} "
            f"({load_words(doc)}; `benchmarks/results/{doc['_file']}`).")


# --------------------------------------------------------------------------- the documents
# --------------------------------------------------------------------------- cdc.py: change streams
CDC_TARGET_MS = 150  # issue 12: p50 commit of a 2,000-event batch on the 1M-row table


def _n(v: float | None) -> str:
    """A whole number with thousands separators, or a dash."""
    return "—" if v is None else f"{v:,.0f}"


@section("cdc")
def _cdc(records: Records) -> str:
    doc = records.latest("cdc")
    if doc is None:
        return missing("cdc.py", "make bench-cdc")
    r = doc["results"]
    rows = []
    for x in r["systems"]:
        if "error" in x:
            rows.append([NAMES.get(x["system"], x["system"]), x["error"]] + ["—"] * 9)
            continue
        feed = x.get("feed")
        rows.append([
            NAMES.get(x["system"], x["system"]), str(x["commits"]), _n(x.get("p50_ms")), _n(x.get("p99_ms")),
            f"{_n(x.get('first50_p50_ms'))} / {_n(x.get('last50_p50_ms'))}", _n(x.get("cpu_p50_ms")), _n(x.get("bytes_per_commit")),
            f"{feed['rows']:,} ({feed['expected_rows']:,})" if feed else "no feed",
            f"{feed['missing']:,} / {feed['extra']:,}" if feed else "—",
            f"{feed['commits_exact']}/{feed['commits']}" if feed else "—",
            {True: "right", False: "WRONG"}.get(x.get("final_ok"), "—"),
        ])
    out = [provenance(doc), "",
           f"{doc['scale']:,} rows before the stream, then up to {r['commits']} commits of {r['events']:,} events, at most "
           f"{r['time_cap_s']:.0f} s of stream per system; milliseconds:", "",
           md_table(["system", "commits", "p50", "p99", "p50 first / last 50", "CPU p50", "bytes/commit", "feed rows (expected)",
                     "missing / extra", "commits exact", "final table"], rows)]
    ours = next((x for x in r["systems"] if x["system"] == "lineage" and x.get("p50_ms")), None)
    if ours:
        peers = [x for x in r["systems"] if x["system"] != "lineage" and x.get("p50_ms")]
        faster = [NAMES.get(x["system"], x["system"]) for x in peers if x["p50_ms"] < ours["p50_ms"]]
        verdict = "meets" if ours["p50_ms"] <= CDC_TARGET_MS else "misses"
        out += ["", (f"Our p50 commit took {ours['p50_ms']:,.0f} ms, which {verdict} the {CDC_TARGET_MS} ms target; "
                     + (f"{and_join(faster)} committed faster at the median." if faster else "no peer committed faster at the median."))]
    return "\n".join(out)


# --------------------------------------------------------------------------- history.py: long histories
HISTORY_NAMES = {"lineage": "ours, no upkeep", "lineage-maintain": "ours, with maintain()", "delta": "delta-rs merge",
                 "ducklake": "DuckLake MERGE INTO", "pyiceberg": "pyiceberg upsert"}
HISTORY_COMMAND = "python benchmarks/history.py --publish"


def _ms_or_dash(v: float | None) -> str:
    return "—" if v is None else (f"{1000 * v:,.0f}" if v >= 0.1 else f"{1000 * v:.1f}")


def _kib(v: float | None) -> str:
    return "—" if v is None else f"{v / 1024:,.1f}"


def _times(a: float | None, b: float | None) -> str:
    return "—" if not a or b is None else f"{b / a:.2f}x"


def _history_rows(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    r = doc["results"]
    first_feed, last_feed = str(min(r["window"], r["commits"])), str(r["commits"])
    headers = ["system", "commits", "median ms, first", "p99", "median ms, last", "p99", "last / first", "KiB per commit, first",
               "last", "last / first", f"feed of {r['feed_commits']} at {int(first_feed):,}, ms", f"at {int(last_feed):,}", "ratio", "on disk MB"]
    rows = []
    for name, x in r["systems"].items():
        label = HISTORY_NAMES.get(name, name)
        if "error" in x:
            rows.append([label, "failed", *(["—"] * 12)])
            continue
        f, la = x["first"], x["last"]
        feeds = x.get("feeds") or {}
        fa, fb = feeds.get(first_feed), feeds.get(last_feed)
        rows.append([
            label, f"{x['commits_done']:,}", _ms_or_dash(f["time"]["median"]), _ms_or_dash(f["time"]["p99"]), _ms_or_dash(la["time"]["median"]), _ms_or_dash(la["time"]["p99"]),
            _times(f["time"]["median"], la["time"]["median"]), _kib(f["bytes"]["median"]), _kib(la["bytes"]["median"]),
            _times(f["bytes"]["median"], la["bytes"]["median"]), _ms_or_dash(fa["seconds"]) if fa else "—", _ms_or_dash(fb["seconds"]) if fb else "—",
            _times(fa["seconds"] if fa else None, fb["seconds"] if fb else None), f"{x['size_on_disk'] / 1e6:,.1f}",
        ])
    return headers, rows


def _history_notes(doc: dict[str, Any]) -> list[str]:
    r = doc["results"]
    out = []
    for name, x in r["systems"].items():
        label = HISTORY_NAMES.get(name, name)
        if "error" in x:
            out.append(f"- {label}: failed ({x['error'][:200]})")
            continue
        bits = []
        ps = x.get("plan_split") or {}
        if "first" in ps:
            bits.append(f"median planning (the upsert's key lookup) / the rest of the commit: {_ms_or_dash(ps['first']['plan_median'])} / "
                        f"{_ms_or_dash(ps['first']['rest_median'])} ms in the first window"
                        + (f", {_ms_or_dash(ps['last']['plan_median'])} / {_ms_or_dash(ps['last']['rest_median'])} ms in the last" if ps.get("last") else ""))
        if x["first"].get("cpu", {}).get("median") is not None and x["last"].get("cpu", {}).get("median") is not None:
            bits.append(f"median CPU per commit {_ms_or_dash(x['first']['cpu']['median'])} then {_ms_or_dash(x['last']['cpu']['median'])} ms")
        if (x["first"].get("kernel") or {}).get("mean") is not None and (x["last"].get("kernel") or {}).get("mean") is not None:
            bits.append(f"kernel (system) CPU per commit, mean {_ms_or_dash(x['first']['kernel']['mean'])} then {_ms_or_dash(x['last']['kernel']['mean'])} ms")
        if x.get("maintain"):
            m = x["maintain"]
            bits.append(f"`maintain()` ran {m['runs']} times, median {m['median']:.1f} s, {m['total_seconds']:,.0f} s in all (not in the commit times)")
        if x.get("extra"):
            bits.append("at the end " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in x["extra"].items()))
        if x.get("stopped"):
            bits.append(x["stopped"])
        if bits:
            out.append(f"- {label}: " + "; ".join(bits) + ".")
    return out


def _history_storage(doc: dict[str, Any]) -> str:
    """Where the run's tables lived: the file system its children recorded (older records: the temp folder on disk)."""
    kinds = sorted({x.get("file_system") for x in doc["results"]["systems"].values() if x.get("file_system")})
    if not kinds:
        return "disk"
    return "/".join(kinds)


def _storage_words(kind: str) -> str:
    if kind == "disk":
        return "the tables lived in the temp folder on the machine's disk (the record predates the file-system field)"
    if kind == "tmpfs":
        return "the tables lived on tmpfs (`--workdir` in a RAM file system)"
    return f"the tables lived on {kind}"


def _newest_of_each_system(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest record, then older ones cut to the systems the newer ones lack (each keeps its provenance).

    A run of one system (``--systems lineage-maintain``) replaces that system's figures without hiding the
    peers' from an earlier run.
    """
    out: list[dict[str, Any]] = []
    for doc in sorted(found, key=lambda d: d["started_at"], reverse=True):  # newest first
        shown = {name for d in out for name in d["results"]["systems"]}
        rest = {k: v for k, v in doc["results"]["systems"].items() if k not in shown}
        if rest:
            out.append({**doc, "results": {**doc["results"], "systems": rest}})
    return out


def _history_by_kind(found: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per file system, :func:`_newest_of_each_system` of its records."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for doc in found:
        kinds.setdefault(_history_storage(doc), []).append(doc)
    return {kind: _newest_of_each_system(docs) for kind, docs in kinds.items()}


@section("history")
def _history(records: Records) -> str:
    found = records.select("history")
    if not found:
        return missing("history.py", HISTORY_COMMAND)
    blocks = []
    for kind, docs in sorted(_history_by_kind(found).items(), key=lambda kv: kv[1][0]["started_at"], reverse=True):
        parts = [f"**Tables on {kind}.**", "", f"Storage: {_storage_words(kind)}."]
        for doc in docs:
            records.cited[doc["_file"]] = doc
            r = doc["results"]
            headers, rows = _history_rows(doc)
            parts += [
                "", provenance(doc), "",
                (f"{r['rows']:,} rows, then {r['commits']:,} upserts of 10 rows (5 updates, 5 inserts). \"first\" is commits 1 to "
                 f"{min(r['window'], r['commits']):,}, \"last\" the last {r['window']:,} commits made; bytes are what appeared on disk per commit."), "",
                md_table(headers, rows, right=set(range(1, len(headers)))), "", *_history_notes(doc),
            ]
        blocks.append("\n".join(parts))
    return "\n\n".join(blocks)


@section("readme-history")
def _readme_history(records: Records) -> str:
    out = []
    for doc in _newest_of_each_system(records.select("history")):
        r = doc["results"]
        said = []
        for name in ("lineage-maintain", "lineage", "delta", "ducklake"):
            x = r["systems"].get(name)
            if not x or "error" in x:
                continue
            f, la = x["first"], x["last"]
            said.append(f"{HISTORY_NAMES[name]}: median commit {_ms_or_dash(f['time']['median'])} ms in the first {min(r['window'], r['commits']):,} commits "
                        f"and {_ms_or_dash(la['time']['median'])} ms in the last {r['window']:,} ({_times(f['time']['median'], la['time']['median'])}), "
                        f"{_kib(f['bytes']['median'])} then {_kib(la['bytes']['median'])} KiB written per commit")
        if said:
            out.append(f"after {r['rows']:,} rows and {r['commits']:,} small upserts ({doc['date']}, tables on {_history_storage(doc)}, "
                       f"{load_words(doc)}; `benchmarks/results/{doc['_file']}`): " + "; ".join(said))
    if not out:
        return missing("history.py", HISTORY_COMMAND)
    return ". ".join(o[0].upper() + o[1:] for o in out) + "."

# --------------------------------------------------------------------------- feed_stream.py
STREAM_SYSTEMS = {"lineage-spark": "our Spark source, memory sink", "lineage-follow": "our `cdf.follow`",
                  "delta": "delta-rs `load_cdf` polled"}


STREAM_MISSING = ("feed_stream.py", "python benchmarks/feed_stream.py --seconds 300 --publish")


def _stream_doc(records: Records) -> dict[str, Any] | None:
    return records.latest("feed_stream", scale=1_000_000)


def _growth(before: float, after: float) -> str:
    """``flat (300 -> 310 MB)`` within 10%, else ``grew`` / ``shrank``."""
    change = (after - before) / before
    how = "flat" if abs(change) <= 0.1 else ("grew" if change > 0 else "shrank")
    return f"{how} ({before:,.0f} -> {after:,.0f} MB)"


def _replay(x: dict[str, Any]) -> str:
    r = x["check"].get("replay")
    return "—" if not r else f"{r['rss_mb_before']:,.0f} -> {r['rss_mb_after']:,.0f}"


def _stream_sentences(doc: dict[str, Any]) -> list[str]:
    r = doc["results"]
    s = r["systems"]
    warm = f"after the first {r.get('warmup', 30):g} s"
    out = []
    if "lineage-spark" in s:
        x = s["lineage-spark"]
        lat, mem = x["latency_s"], x["rss_mb"]
        met = "met" if lat["p50"] < 2 else "missed"
        out.append(f"Our Spark source delivered a commit's rows to the memory sink in {fmt_s(lat['p50'])} s at the median and "
                   f"{fmt_s(lat['p99'])} s at p99 {warm} with a {r['trigger']:g} s trigger (target: p50 under 2 s, {met}; the slowest of all "
                   f"commits, warm-up included, {fmt_s(lat['all_max'])} s). Memory from two minutes in to the end, its Python processes "
                   f"(driver, Spark's daemons, the source's planner, the executors' workers): {_growth(mem['python_settled'], mem['python_end'])}; "
                   f"with Spark's JVM: "
                   f"{_growth(mem['settled'], mem['end'])}.")
    if "lineage-follow" in s and "delta" in s:
        ours, peer = s["lineage-follow"], s["delta"]
        replay = ours["check"].get("replay")
        out.append(f"Polling every {r['trigger']:g} s, `cdf.follow` had a p50 of {fmt_s(ours['latency_s']['p50'])} s, "
                   + versus(ours["latency_s"]["p50"], peer["latency_s"]["p50"], "delta-rs polling with `load_cdf`")
                   + f", and a p99 of {fmt_s(ours['latency_s']['p99'])} s against {fmt_s(peer['latency_s']['p99'])} s. "
                   f"Memory of `cdf.follow` from two minutes in to the end, while the table gained a data file, a delete file and a "
                   f"manifest per commit: {_growth(ours['rss_mb']['settled'], ours['rss_mb']['end'])}; of delta-rs's poller: "
                   f"{_growth(peer['rss_mb']['settled'], peer['rss_mb']['end'])}"
                   + (f"; of `cdf.follow` reading the run's {replay['versions']} versions again on the finished table: "
                      f"{_growth(replay['rss_mb_before'], replay['rss_mb_after'])}." if replay else "."))
    wrong = [STREAM_SYSTEMS.get(k, k) for k, x in s.items() if not x["check"]["exact"]]
    out.append("Every consumer received exactly the feed of the run." if not wrong else f"NOT exact: {and_join(wrong)}.")
    return out


@section("feed-stream")
def _feed_stream(records: Records) -> str:
    doc = _stream_doc(records)
    if doc is None:
        return missing(*STREAM_MISSING)
    r = doc["results"]
    rows = []
    for key, x in r["systems"].items():
        lat, mem = x["latency_s"], x["rss_mb"]
        rows.append([STREAM_SYSTEMS.get(key, key), f"{x['commits']:,}", _ms(x["commit_s_p50"]), fmt_s(lat["p50"]), fmt_s(lat["p99"]),
                     fmt_s(lat["all_max"]), f"{mem['settled']:,.0f} -> {mem['end']:,.0f}", f"{mem['python_settled']:,.0f} -> {mem['python_end']:,.0f}",
                     _replay(x), "yes" if x["check"]["exact"] else "NO"])
    c = r["commit"]
    return "\n".join([
        provenance(doc), "",
        f"{doc['scale']:,}-row table, a commit in every {r['interval']:g} s for {r['seconds']:g} s (an upsert of {c['updates']} rows "
        f"of one {c['window']:,}-id window and {c['inserts']} new ids), followed with a {r['trigger']:g} s trigger or poll interval. "
        f"Latency percentiles leave out the commits of the first {r.get('warmup', 30):g} s; the maximum is over all commits. Memory is "
        "resident MB of the consumer's process tree from two minutes in to the end, all of it and its Python processes (the tree less "
        "Spark's JVM), and around a replay of the run's versions on the finished table:", "",
        md_table(["consumer", "commits", "commit p50 ms", "latency p50 s", "p99 s", "max s", "RSS MB", "Python RSS MB", "replay RSS MB",
                  "rows exact"], rows),
        "", " ".join(_stream_sentences(doc)),
    ])


@section("readme-feed-stream")
def _readme_feed_stream(records: Records) -> str:
    doc = _stream_doc(records)
    if doc is None:
        return missing(*STREAM_MISSING)
    return f"{doc['date']} (`benchmarks/results/{doc['_file']}`), {load_words(doc)}. " + " ".join(_stream_sentences(doc))
