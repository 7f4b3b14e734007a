"""Files and bytes on disk before and after each maintenance operation, on a table with many small commits.

Builds one keyed table: ``--rows`` generated orders in one append, then ``--commits`` small merge-on-read
commits that cycle through an append of new orders, an update of random orders, a delete of random orders
and an upsert (half existing keys, half new), with a copy-on-write update every ``--cow-every`` commits.
The table keeps the change feed for the last ``--retention`` versions (``lineage.cdf.retention.versions``).
Then it runs, in turn:

1. ``t.rewrite_deletes()``                    one position delete file per data file
2. ``t.compact()``                            data files rewritten without their deleted rows, small files merged
3. ``t.expire_snapshots(retain_last=1)``      every snapshot but the current one expired
4. ``t.vacuum(older_than=timedelta(0))``      unreferenced files deleted (pinned files kept for the window)
5. ``t.rehome()`` until it finds nothing (it moves at most 64 files per call), then ``t.vacuum(...)``:
   sparse pinned files copied into archives and released

and prints, before and after each step, the files under the table's folder by kind (count and bytes):
data files, position delete files, Iceberg metadata (metadata JSON, manifest lists, manifests), lineage
(segments, lists) and index (deleted-rows segments, archives), plus the data and delete files the current
snapshot references, and the step's wall time. It also checks that the scan and the change feed over the
whole retention window are the same at the end as at the start (row count, feed rows by change type).

    .venv/bin/python benchmarks/maintenance_report.py                     # 100,000 rows, 200 commits
    .venv/bin/python benchmarks/maintenance_report.py --rows 1000000 --commits 500

Writes JSON (default ``benchmarks/results/maintenance_report.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cdf  # noqa: E402
import lineage  # noqa: E402
import record  # noqa: E402

SEED = 42
SCHEMA = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("customer_id", pa.int64()),
        pa.field("status", pa.string()),
        pa.field("amount", pa.float64()),
    ]
)
KINDS = ("data", "deletes", "iceberg-meta", "lineage", "index")
MAX_REHOMES = 5


def orders(rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "order_id": ids.astype(np.int64),
            "customer_id": rng.integers(0, 50_000, n),
            "status": np.array(["new", "paid", "shipped", "cancelled"])[rng.integers(0, 4, n)],
            "amount": np.round(rng.uniform(1.0, 1000.0, n), 2),
        },
        schema=SCHEMA,
    )


def kind_of(root: str, path: str) -> str:
    rel = os.path.relpath(path, root)
    if rel.startswith("data" + os.sep):
        return "deletes" if path.endswith("-deletes.parquet") else "data"
    if rel.startswith((os.path.join("metadata", "_lineage"), os.path.join("metadata", "lineage"))):
        return "lineage"
    if rel.startswith((os.path.join("metadata", "_index"), os.path.join("metadata", "index"))):
        return "index"
    return "iceberg-meta"


def inventory(t: lineage.Table) -> dict:
    """Files on disk by kind, and the data/delete files of the current snapshot."""
    root = t.iceberg.metadata.location.removeprefix("file://")
    disk = {k: [0, 0] for k in KINDS}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            k = kind_of(root, path)
            disk[k][0] += 1
            disk[k][1] += os.path.getsize(path)
    t.refresh()
    snap = t.iceberg.metadata.current_snapshot()
    live = {"data": [0, 0], "deletes": [0, 0]}
    for m in snap.manifests(t.iceberg.io):
        for e in m.fetch_manifest_entry(t.iceberg.io, discard_deleted=True):
            k = "deletes" if m.content == 1 else "data"
            live[k][0] += 1
            live[k][1] += e.data_file.file_size_in_bytes
    return {
        "disk": {k: {"files": c, "bytes": b} for k, (c, b) in disk.items()},
        "snapshot": {k: {"files": c, "bytes": b} for k, (c, b) in live.items()},
        "snapshots": len(t.iceberg.metadata.snapshots),
        "version": t.version,
    }


def build(warehouse: str, rows: int, commits: int, cow_every: int, retention: int, batch: int) -> tuple[lineage.Table, float]:
    rng = np.random.default_rng(SEED)
    t = lineage.create_table(
        "bench.orders", SCHEMA, key=["order_id"], warehouse=warehouse,
        properties={"lineage.cdf.retention.versions": str(retention)},
    )
    started = time.perf_counter()
    t.append(orders(rng, np.arange(rows)))
    live = np.arange(rows, dtype=np.int64)
    next_id = rows
    for i in range(commits):
        kind = i % 4
        if kind == 0:
            new = np.arange(next_id, next_id + batch)
            next_id += batch
            t.append(orders(rng, new))
            live = np.concatenate([live, new])
        elif kind == 1:
            ids = rng.choice(live, batch // 2, replace=False)
            mode = lineage.COPY_ON_WRITE if cow_every and (i + 1) % cow_every == 0 else None
            t.update(f"order_id IN ({', '.join(map(str, ids))})", {"amount": "amount + 1"}, mode=mode)
        elif kind == 2:
            ids = rng.choice(live, batch // 4, replace=False)
            t.delete(f"order_id IN ({', '.join(map(str, ids))})")
            live = np.setdiff1d(live, ids)
        else:
            old = rng.choice(live, batch // 4, replace=False)
            new = np.arange(next_id, next_id + batch // 4)
            next_id += batch // 4
            t.upsert(orders(rng, np.concatenate([old, new])))
            live = np.concatenate([live, new])
        if (i + 1) % 50 == 0:
            print(f"  {i + 1} commits, version {t.version}, {time.perf_counter() - started:.0f} s", flush=True)
    return t, time.perf_counter() - started


def fingerprint(t: lineage.Table, start: int) -> dict:
    """What must not change: the rows, and the change feed from ``start`` to the current version."""
    scan = t.scan(columns=["order_id", "amount", "_row_id", "_row_created_at_version", "_row_last_updated_at_version"])
    started = time.perf_counter()
    feed = cdf.changes(t, start)
    feed_s = time.perf_counter() - started
    by_type = {}
    for kind in sorted(set(feed.column("_change_type").to_pylist())):
        part = feed.filter(pc.equal(feed.column("_change_type"), kind))
        by_type[kind] = [part.num_rows, pc.sum(part.column("_row_id")).as_py(), round(pc.sum(part.column("amount")).as_py(), 2),
                         pc.sum(part.column("_commit_version")).as_py()]
    return {
        "rows": scan.num_rows,
        "row_id_sum": pc.sum(scan.column("_row_id")).as_py(),
        "lineage_sum": pc.sum(scan.column("_row_created_at_version")).as_py() + pc.sum(scan.column("_row_last_updated_at_version")).as_py(),
        "amount_sum": round(pc.sum(scan.column("amount")).as_py(), 2),
        "feed_from": start,
        "feed": by_type,
        "feed_wall_s": round(feed_s, 3),
    }


def fmt(inv: dict, kind: str) -> str:
    d = inv["disk"][kind]
    return f"{d['files']:>5} {d['bytes']:>12,}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--batch", type=int, default=200, help="rows per append; updates touch batch/2, deletes and upserts batch/4")
    ap.add_argument("--cow-every", type=int, default=50, help="every Nth commit's update is copy-on-write (0: never)")
    ap.add_argument("--retention", type=int, default=50, help="lineage.cdf.retention.versions")
    ap.add_argument("--publish", action="store_true", help="write the record to benchmarks/results/ (tracked; default: results/scratch/)")
    ap.add_argument("--out", default=None, help="write the record to this path instead")
    ap.add_argument("--workdir", default=None, help="keep the table here instead of a temporary folder")
    args = ap.parse_args(argv)
    rec = record.Recorder("maintenance_report", scale=args.rows, argv=argv, settings=vars(args))

    workdir = args.workdir or tempfile.mkdtemp(prefix="maintenance-report-")
    warehouse = os.path.join(workdir, "wh")
    try:
        print(f"building: {args.rows:,} rows, then {args.commits} small commits", flush=True)
        t, build_s = build(warehouse, args.rows, args.commits, args.cow_every, args.retention, args.batch)
        # the feed checked before and after: from a version that stays inside the window after the
        # maintenance commits below (rewrite, compact, re-homes), which are versions too
        start = max(0, t.version - args.retention + 3 + MAX_REHOMES)
        before_all = fingerprint(t, start)
        def rehome_all():  # noqa: ANN202
            calls, last = [], None
            for _ in range(MAX_REHOMES):
                res = t.rehome()
                if res.version is None:
                    break
                calls.append(res.detail.split(";")[0])
                last = res
            return dataclasses.replace(last or res, detail=f"{len(calls)} call(s) committed: " + " | ".join(calls))

        steps = [
            ("rewrite_deletes()", lambda: t.rewrite_deletes()),
            ("compact()", lambda: t.compact()),
            ("expire_snapshots(retain_last=1)", lambda: t.expire_snapshots(retain_last=1)),
            ("vacuum(older_than=0)", lambda: t.vacuum(older_than=dt.timedelta(0))),
            ("rehome() until nothing left", rehome_all),
            ("vacuum(older_than=0) after rehome", lambda: t.vacuum(older_than=dt.timedelta(0))),
        ]
        results = []
        inv = inventory(t)
        initial = inv
        for name, call in steps:
            started = time.perf_counter()
            res = call()
            wall = time.perf_counter() - started
            after = inventory(t)
            results.append({"step": name, "wall_s": round(wall, 3), "version": res.version, "detail": res.detail.splitlines()[0] if res.detail else "",
                            "files_added": res.files_added, "files_removed": res.files_removed, "before": inv, "after": after})
            inv = after
        after_all = fingerprint(t, start)
        same = {k: before_all[k] == after_all[k] for k in ("rows", "row_id_sum", "lineage_sum", "amount_sum", "feed")}

        header = f"{'step':<36} {'wall s':>7}  " + "  ".join(f"{k:>18}" for k in KINDS)
        print(f"\nbuilt in {build_s:.0f} s: version {initial['version']}, {initial['snapshots']} snapshots")
        print(f"current snapshot: {initial['snapshot']['data']['files']} data files ({initial['snapshot']['data']['bytes']:,} B), "
              f"{initial['snapshot']['deletes']['files']} delete files ({initial['snapshot']['deletes']['bytes']:,} B)")
        print("\nfiles and bytes on disk (count, bytes) after each step\n" + header)
        print(f"{'(before)':<36} {'':>7}  " + "  ".join(fmt(initial, k) for k in KINDS))
        for r in results:
            print(f"{r['step']:<36} {r['wall_s']:>7.2f}  " + "  ".join(fmt(r["after"], k) for k in KINDS))
            s = r["after"]["snapshot"]
            print(f"{'':<36} {'':>7}  snapshot: {s['data']['files']} data, {s['deletes']['files']} delete files; "
                  f"{r['after']['snapshots']} snapshots; version {r['after']['version']}; {r['detail']}")
        print(f"\nscan and feed unchanged: {same}")
        print(f"feed from version {start}: {({k: v[0] for k, v in before_all['feed'].items()})} rows; "
              f"took {before_all['feed_wall_s']} s before maintenance, {after_all['feed_wall_s']} s after")

        report = {
            "commits": args.commits,
            "build_s": round(build_s, 1),
            "initial": initial,
            "steps": results,
            "fingerprint_before": before_all,
            "fingerprint_after": after_all,
            "unchanged": same,
        }
        path = rec.finish(report, publish=args.publish, out=args.out)
        print(f"record written to {os.path.relpath(path)}")
        if not all(same.values()):
            print("maintenance changed the table's rows or its change feed", file=sys.stderr)
            return 1
        return 0
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
