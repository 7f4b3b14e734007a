"""The generated section of benchmarks/object_store.py: every system on one S3 server behind a counting, latency-adding proxy."""

from __future__ import annotations

from typing import Any

from report_base import NAMES, Records, md_table, missing, provenance, section


def _feed(x: dict[str, Any]) -> str:
    if not x:
        return "—"
    if "na" in x:
        return "n/a"
    return f"{x['seconds']:.2f} s, {x['get_bytes'] / 1e3:,.0f} KB read for {x['result_bytes'] / 1e3:,.0f} KB ({x['rows']:,} rows)"


@section("object-store")
def _object_store(records: Records) -> str:
    doc = records.latest("object_store")
    if doc is None:
        return missing("object_store.py", "python benchmarks/object_store.py --publish")
    r = doc["results"]
    rows = []
    for name, x in r["systems"].items():
        label = NAMES.get(name, name)
        if "error" in x:
            rows.append([label, "failed: " + x["error"].splitlines()[0][:80], "", "", "", "", ""])
            continue
        u = x["small_upsert"]
        rows.append([label, f"{u['p50_ms']:,.0f}", f"{u['p99_ms']:,.0f}", f"{u['requests_per_commit_median']:g}",
                     _feed(x.get("feed_last_5", {})), _feed(x.get("feed_last_25", {})),
                     f"{x['full_scan']['seconds']:.2f}" if "full_scan" in x else "—"])
    s = doc["settings"]
    return "\n".join([
        provenance(doc), "",
        f"A table of {s['rows']:,} rows; {s['commits']} small upserts (5 updates, 5 inserts) by one long-lived writer; "
        f"{r['latency_ms']:g} ms added to every request:", "",
        md_table(["system", "upsert p50, ms", "upsert p99, ms", "requests per upsert (median)", "feed of the last 5 upserts",
                  "feed of the last 25 upserts", "full scan, s"], rows),
    ])
