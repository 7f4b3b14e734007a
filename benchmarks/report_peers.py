"""Sections of benchmarks/report.py for benchmarks/run.py: ours against the peers, the feed targets, the README's performance summary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from report_base import (
    EVEN,
    NAMES,
    SECTIONS,
    Records,
    and_join,
    fmt_int,
    fmt_mb,
    fmt_s,
    latest_per_scale,
    load_words,
    mb,
    md_table,
    missing,
    provenance,
    rows_label,
    section,
    versus,
)

# --------------------------------------------------------------------------- run.py: ours against the peers
GROUP_LABELS = ("create", "append base", "20 change commits", "5 upserts", "all writes", "cdf (a) all", "cdf (b) last 5", "cdf (c) net")
FEED_GROUPS = ("cdf (a) all", "cdf (b) last 5", "cdf (c) net")
WRITE_GROUPS = ("20 change commits", "5 upserts", "all writes")
FEED_SHORT = {"cdf (a) all": "(a) all changes", "cdf (b) last 5": "(b) the last 5 commits", "cdf (c) net": "(c) net changes"}
CHANGE_TYPES = ("insert", "update_preimage", "update_postimage", "delete")


def _ratio(peer: float | None, ours: float | None) -> str:
    return "—" if peer is None or not ours else f"{peer / ours:.2f}x"


def render_peers(doc: dict[str, Any]) -> str:
    """The tables of one ``run.py`` record: wall time and ratios, bytes and memory, feed agreement."""
    res, s = doc["results"], doc["results"]["summary"]
    systems = list(res["systems"])
    peers = [x for x in systems if x != "lineage"]
    t = s["time_s"]
    out = ["**Wall time, seconds (ratio = peer time / our time; >1x means the peer is slower)**", ""]
    rows = []
    for label in GROUP_LABELS:
        rows.append([label, *(fmt_s(t[label][x]) if t[label][x] is not None else s["na"][label][x] for x in systems),
                     *(_ratio(t[label][p], t[label]["lineage"]) for p in peers)])
    rows.append(["load during its slot", *(f"{v[0]:.0f}-{v[1]:.0f}" if v else "—" for v in (s["load1_per_system"][x] for x in systems)), *([""] * len(peers))])
    out.append(md_table(["step", *(f"{x} s" for x in systems), *(f"{p}/ours" for p in peers)], rows))
    out += _feed_calls(res, doc.get("settings") or {})
    out += ["", "**Bytes written (MB) and peak RSS of the process during the step (MB, max over the group)**", ""]
    b, m = s["bytes_written"], s["peak_rss_mb"]
    rows = [[label, *(fmt_mb(b[label][x]) for x in systems), *("—" if m[label][x] is None else f"{m[label][x]:.0f}" for x in systems)] for label in GROUP_LABELS]
    rows.append(["table on disk at the end", *(fmt_mb(s["table_bytes"][x]) for x in systems), *([""] * len(systems))])
    rows.append(["process peak RSS (all steps)", *([""] * len(systems)), *("—" if s["process_peak_rss_mb"][x] is None else f"{s['process_peak_rss_mb'][x]:.0f}" for x in systems)])
    out.append(md_table(["step", *(f"{x} MB written" for x in systems), *(f"{x} peak RSS" for x in systems)], rows))
    out += ["", "**Change feeds: rows, counts by change type (insert / update_preimage / update_postimage / delete), agreement**", ""]
    rows = []
    for feed in ("all", "last5", "net"):
        exp = res["expected"]["feeds"][feed]["counts"]
        rows.append([feed, "(workload implies)", fmt_int(sum(exp.values())), *(fmt_int(exp[c]) for c in CHANGE_TYPES), "", "", ""])
        for x in systems:
            f = res["feeds"][feed][x]
            if "na" in f:
                rows.append([feed, x, "n/a", "", "", "", "", "", "", f["na"][:90]])
                continue
            same = "—" if x == "lineage" else ("yes" if f.get("matches_ours") else "NO")
            note = ""
            if x == "lance":
                note = "no pre-images; ins/post/del " + ("equal" if f.get("matches_ours_net_except_preimages") else "differ from") + " our net feed over the same range"
            elif f.get("differences_from_ours") and x != "lineage":
                note = "differs: " + ", ".join(f"{k} {v:+,}" for k, v in f["differences_from_ours"].items())
            rows.append([feed, x, fmt_int(f["rows"]), *(fmt_int(f["counts"][c]) for c in CHANGE_TYPES), same, "yes" if f["matches_expected"] else "NO", note])
    out.append(md_table(["feed", "system", "rows", "ins", "pre", "post", "del", "= ours", "= workload", "note"], rows, right={2, 3, 4, 5, 6}))
    probe = s.get("table_changes_probe")
    if probe:
        out += ["", "DuckLake's `SELECT * FROM table_changes(...)` fetched directly (separate process, time limit; the timings above go through a temp table):", ""]
        for feed, pr in probe.items():
            out.append(f"- {feed}: " + (f"answered in {pr['seconds']:.3f} s, {pr['rows']:,} rows" if pr.get("ok") else str(pr.get("error"))))
    final = s["final"]
    checked = [x for x in systems if final.get(x)]
    ok = [x for x in checked if final[x]["matches_expected"]]
    out += ["", "Final tables against the workload (rows, `sum(id)`, `sum(amount)`): "
            + ", ".join(f"{x} {'matches' if x in ok else 'DIFFERS'}" for x in checked)
            + "".join(f"; {x} not checked ({s['errors'].get(x, 'no result')})" for x in systems if x not in checked) + "."]
    return "\n".join(out)


def _feed_calls(res: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """How the feed and append times were taken: the median of several calls (listed), or one call."""
    firsts, calls = [], set()
    for x, r in res["systems"].items():
        steps = [st for st in r.get("steps", []) if st["kind"] == "feed" and st.get("calls_wall_s")]
        if steps:
            calls.update(len(st["calls_wall_s"]) for st in steps)
            firsts.append(f"{x} " + " / ".join(fmt_s(st["wall_s"]) for st in steps))
    out = []
    if firsts:
        n = "/".join(str(c) for c in sorted(calls))
        out += ["", f"Feed times are the median of {n} calls in a row in the system's process (the first call is the step whose peak "
                f"RSS is reported). First calls, s, per feed in the order above: {'; '.join(firsts)}."]
        if settings.get("row_group_cache_mb") is not None:
            out[-1] += (f" Our reader keeps decoded row groups between calls (`LINEAGE_ROW_GROUP_CACHE_MB={settings['row_group_cache_mb']}`): "
                        "a call finds kept, within that budget, what the process's earlier reads decoded (in records from the "
                        "sixth session of 2026-11-26 on: what they decoded twice, so the second call decodes again).")
    appends = {x: st["calls_wall_s"] for x, r in res["systems"].items() for st in r.get("steps", [])
               if st["step"] == "append" and len(st.get("calls_wall_s") or []) > 1}
    if appends:
        n = "/".join(sorted({str(len(c)) for c in appends.values()}))
        listed = "; ".join(f"{x} " + " / ".join(fmt_s(c) for c in v) for x, v in appends.items())
        out += ["", f"The append base time is the median of {n} appends of the same rows, the first into the benchmark's table "
                f"(the step whose peak RSS is reported), the others into fresh tables after the feeds. All calls, s: {listed}."]
    return out


def peer_sentences(doc: dict[str, Any], groups: tuple[str, ...]) -> list[str]:
    """One sentence per step group: our time, then every peer as faster / slower / even."""
    t, scale = doc["results"]["summary"]["time_s"], rows_label(doc["scale"])
    out = []
    for label in groups:
        ours = t[label].get("lineage")
        if ours is None:
            out.append(f"{label} at {scale} rows: ours did not finish.")
            continue
        cmp = [versus(ours, v, NAMES[p]) for p, v in t[label].items() if p != "lineage" and v is not None]
        out.append(f"{label} at {scale} rows: ours {fmt_s(ours)} s, " + (", ".join(cmp) if cmp else "no peer answers") + ".")
    return out


def slower_than(doc: dict[str, Any], groups: tuple[str, ...]) -> dict[str, list[str]]:
    """Peer -> the groups where the peer was faster than ours by more than 10% (our other modes are not peers)."""
    t = doc["results"]["summary"]["time_s"]
    out: dict[str, list[str]] = {}
    for label in groups:
        ours = t[label].get("lineage")
        for p, v in t[label].items():
            if not p.startswith("lineage") and v is not None and ours and ours / v >= EVEN:
                out.setdefault(p, []).append(label)
    return out


def is_peer_run(d: dict[str, Any]) -> bool:
    return "lineage" in d["results"]["systems"] and len(d["results"]["systems"]) > 1


@section("peers-records")
def _peers_records(records: Records) -> str:
    docs = {}
    for d in records.select("run", where=is_peer_run):
        docs[d["scale"]] = d  # newest per scale
    if not docs:
        return missing("a run against the peers", "make bench-peers")
    lines = []
    for scale in sorted(docs):
        d = records.latest("run", where=is_peer_run, scale=scale)
        assert d is not None
        lines.append(f"- {rows_label(scale)} rows: `benchmarks/results/{d['_file']}` ({d['date']}, {load_words(d)})")
    return "\n".join(lines)


def _peers_at(scale: int) -> Callable[[Records], str]:
    def render(records: Records) -> str:
        doc = records.latest("run", where=is_peer_run, scale=scale)
        if doc is None:
            return missing(f"the peer run at {rows_label(scale)} rows", f"make bench-peers SCALE={scale}")
        slow = slower_than(doc, FEED_GROUPS)
        feeds = "; ".join(f"{NAMES[p]} on {and_join(FEED_SHORT[g] for g in groups)}" for p, groups in slow.items()) or "none"
        text = [provenance(doc), "", render_peers(doc), "", "**In words** (computed from the table above):", ""]
        text += [f"- {s}" for s in peer_sentences(doc, WRITE_GROUPS + FEED_GROUPS)]
        text.append(f"- Peers whose change feed is faster than ours by more than 10%: {feeds}.")
        b = doc["results"]["summary"]["bytes_written"]["all writes"]
        if b.get("lineage"):
            cmp = [versus(b["lineage"], v, NAMES[p], unit="bytes") for p, v in b.items() if p != "lineage" and v]
            text.append(f"- Bytes written by all writes: ours {mb(b['lineage'])}, " + ", ".join(cmp) + ".")
        return "\n".join(text)
    return render


for _scale in (1_000_000, 10_000_000, 30_000_000):
    SECTIONS[f"peers-{rows_label(_scale).lower()}"] = _peers_at(_scale)


def feed_peak(s: dict[str, Any], system: str) -> float | None:
    """A system's peak RSS over the change-feed steps it ran."""
    peaks = [s["peak_rss_mb"][g].get(system) for g in FEED_GROUPS]
    peaks = [p for p in peaks if p is not None]
    return max(peaks) if peaks else None


def target_rows(doc: dict[str, Any]) -> list[list[str]]:
    """Issue 16's targets against one run.py record: what was asked, the figures of that one run, met or not."""
    s = doc["results"]["summary"]
    t = s["time_s"]
    scale = rows_label(doc["scale"])
    rows: list[list[str]] = []

    def add(what: str, ours: float | None, others: dict[str, float | None], met_if: Callable[[float, float], bool], unit: str = "s") -> None:
        known = {p: v for p, v in others.items() if v is not None}
        if ours is None or not known:
            return
        shown = ", ".join(f"{NAMES[p]} {fmt_s(v) if unit == 's' else f'{v:,.0f}'}" for p, v in known.items())
        best = min(known.values())
        ok = all(met_if(ours, v) for v in known.values())
        ratio = f"{best / ours:.2f}x" if unit == "s" else f"{ours / best:.2f}x"
        rows.append([what, scale, fmt_s(ours) if unit == "s" else f"{ours:,.0f}", shown, ratio, "met" if ok else "missed"])

    for label, short in (("cdf (a) all", "(a)"), ("cdf (b) last 5", "(b)"), ("cdf (c) net", "(c) net")):
        add(f"default feed {short} faster than DuckLake and Lance", t[label].get("lineage"),
            {p: t[label].get(p) for p in ("ducklake", "lance")}, lambda o, v: o < v)
    peers = [p for p in s["time_s"]["cdf (a) all"] if not p.startswith("lineage")]
    add("default feed peak RSS (MB) at or below the lowest peer's", feed_peak(s, "lineage"),
        {p: feed_peak(s, p) for p in peers}, lambda o, v: o <= v, unit="MB")
    for label, short in (("cdf (a) all", "(a)"), ("cdf (b) last 5", "(b)")):
        add(f"feed with capture {short} faster than delta-rs", t[label].get("lineage-capture"), {"delta": t[label].get("delta")}, lambda o, v: o < v)
    app, ice = t["append base"].get("lineage"), t["append base"].get("pyiceberg")
    if app is not None and ice:
        rows.append(["append: our time at most 1.10x pyiceberg's", scale, fmt_s(app), f"pyiceberg {fmt_s(ice)}", f"{app / ice:.2f}x",
                     "met" if app <= 1.10 * ice else "missed"])
    m = s["peak_rss_mb"]["append base"]
    if m.get("lineage") is not None and m.get("pyiceberg"):
        r = m["lineage"] / m["pyiceberg"]
        rows.append(["append: peak RSS at most 1.2x pyiceberg's", scale, f"{m['lineage']:,.0f}", f"pyiceberg {m['pyiceberg']:,.0f}", f"{r:.2f}x",
                     "met" if r <= 1.2 else "missed"])
    return rows


@section("feed-targets")
def _feed_targets(records: Records) -> str:
    rows: list[list[str]] = []
    cited = []
    for scale in (1_000_000, 10_000_000, 30_000_000):
        doc = records.latest("run", where=is_peer_run, scale=scale)
        if doc is not None:
            rows += target_rows(doc)
            cited.append(f"`benchmarks/results/{doc['_file']}` ({doc['date']}, {load_words(doc)})")
    if not rows:
        return missing("a run against the peers", "make bench-peers")
    return "\n".join([
        "Each line compares figures of one run (" + "; ".join(cited) + "). Ratio: the named peer's time over ours "
        "(the fastest peer's where several are named; above 1x ours is faster), or our memory over the lowest peer's.", "",
        md_table(["target", "rows", "ours", "peers", "ratio", ""], rows, right={2, 4}),
    ])


@section("readme-performance")
def _readme_performance(records: Records) -> str:
    out = []
    wc = records.latest("write_cost", variant="scattered")
    if wc:
        sc = {r["scenario"]: r for r in wc["results"]["scenarios"]}
        mor, cow = sc["lineage update, merge-on-read"], sc["lineage update, copy-on-write"]
        ice = sc["pyiceberg overwrite(filter), copy-on-write"]
        out.append(f"A merge-on-read update of {wc['results']['percent']:g}% of the rows of a {rows_label(wc['scale'])}-row table "
                   f"({wc['results']['data_files_per_table']} data files, every one touched) wrote "
                   f"{mor['ratio_written_to_table']:.1%} of the table's bytes; the same update copy-on-write wrote "
                   f"{cow['ratio_written_to_table']:.1%}, and plain pyiceberg's overwrite (copy-on-write only) "
                   f"{ice['ratio_written_to_table']:.1%} (`benchmarks/results/{wc['_file']}`).")
    docs = latest_per_scale(records, "run", is_peer_run)
    for d in docs:
        t, b = d["results"]["summary"]["time_s"]["all writes"], d["results"]["summary"]["bytes_written"]["all writes"]
        scale = rows_label(d["scale"])
        writes = ", ".join(versus(t["lineage"], v, NAMES[p]) for p, v in t.items() if p != "lineage" and v is not None) if t.get("lineage") else "not measured"
        wrote = ", ".join(f"{NAMES[p]} {mb(v)}" for p, v in b.items() if p != "lineage" and v)
        slow = slower_than(d, FEED_GROUPS)
        feeds = "; ".join(f"{NAMES[p]}'s on {and_join(FEED_SHORT[g] for g in gs)}" for p, gs in slow.items())
        out.append(f"At {scale} rows ({d['date']}, {load_words(d)}): all our writes took {fmt_s(t.get('lineage'))} s, {writes}; "
                   f"they wrote {mb(b['lineage'])} against {wrote}. "
                   + (f"Our change feeds were slower than {feeds}" if feeds else "No peer's change feed was faster than ours")
                   + f" (`benchmarks/results/{d['_file']}`).")
    if not out:
        return missing("any benchmark", "make bench-all")
    return "\n\n".join(out)
