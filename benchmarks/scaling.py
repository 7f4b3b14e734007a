"""How our change-feed cost grows: with the table (fixed change volume) and with the change volume (fixed table).

Series 1, **table size**: for each size in ``--sizes`` (default 1, 2, 5 and 10
million rows) a fresh table is loaded in appends of ``--append-rows`` rows
(default 1,000,000, so one data file per million rows, like daily batches),
then ``--commits`` change commits (default 10) each update ``--updates`` rows
(default 5,000) and delete ``--deletes`` rows (default 1,000) chosen at random,
one ``Table.merge`` each, as in ``benchmarks/run.py``. So every size gets the
same 50,000 updates and 10,000 deletes. Measured: the change feed over those
commits (per-version and net, best of ``--repeat``, each call with the decoded
row-group cache emptied first, so that every call decodes what it reads), the deleted-rows index
bytes they wrote, and where the feed's time goes (pointers from metadata, then
the values of the images the feed shows; measured with the ``cdf`` package's own functions).

Series 2, **change volume**: one table of ``--fixed-rows`` rows (default
1,000,000) gets ``--volume-commits`` commits (default 20) of the same size;
the feed is read over the last 1, 2, 5, 10 and 20 of them, so the change
volume grows with a fixed table.

    .venv/bin/python benchmarks/scaling.py                          # both series
    .venv/bin/python benchmarks/scaling.py --sizes 1000000,2000000 --skip-volume

Writes a record (``benchmarks/record.py``; ``--publish``: into ``benchmarks/results/``) and prints both series.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import cdf  # noqa: E402
import lineage  # noqa: E402
from cdf import plan  # noqa: E402
from cdf.engine_duckdb import image_values  # noqa: E402
from cdf.pointers import change_pointers  # noqa: E402
from lineage import decoded_cache  # noqa: E402
from lineage.storage.fileio import local_path  # noqa: E402
from lineage.storage.metadata import is_inline_segment, read_list, segment_object  # noqa: E402
import record  # noqa: E402
from record import files_under  # noqa: E402
from run import SCHEMA, SEED, UPDATED, Mirror  # noqa: E402


def build(root: str, rows: int, append_rows: int, commits: int, updates: int, deletes: int) -> tuple[lineage.Table, dict[str, Any]]:
    """A table of ``rows`` rows plus ``commits`` change commits; returns it and the build figures."""
    rng = np.random.default_rng(SEED)
    m = Mirror(rows, rows, rng)
    t = lineage.create_table("bench.orders", SCHEMA, key=["id"], warehouse=root)
    start = time.perf_counter()
    for lo in range(0, rows, append_rows):
        t.append(m.rows(np.arange(lo, min(rows, lo + append_rows))))
    load_s = time.perf_counter() - start
    base = t.version
    change_s = []
    for _ in range(commits):
        chosen = m.pick_live(updates + deletes)
        upd, dele = np.sort(chosen[:updates]), np.sort(chosen[updates:])
        m.amount[upd] = m.new_amounts(updates)
        m.status[upd] = UPDATED
        m.alive[dele] = False
        start = time.perf_counter()
        t.merge(upserts=m.rows(upd), deletes=pa.table({"id": pa.array(dele, pa.int64())}))
        change_s.append(time.perf_counter() - start)
    return t, {"base_version": base, "load_s": round(load_s, 2), "change_commit_s": [round(s, 3) for s in change_s]}


def index_bytes(t: lineage.Table, a: int, b: int) -> dict[str, int]:
    """Bytes of the deleted-rows index segments and lineage segments written by the commits in ``(a, b]``."""
    out = {"index_bytes": 0, "lineage_segment_bytes": 0, "removed_images": 0}
    for c in t.state().lineage.commits:
        if a < c.version <= b:
            if c.index:
                out["index_bytes"] += os.path.getsize(local_path(c.index))
            if getattr(c, "segment", None) and is_inline_segment(c.segment):  # inside its list: the size that list records
                out["lineage_segment_bytes"] += read_list(t.iceberg.io, segment_object(c.segment)).segment_bytes.get(c.segment, 0)
            elif getattr(c, "segment", None):
                out["lineage_segment_bytes"] += os.path.getsize(local_path(c.segment))
    out["removed_images"] = sum(h.updated + h.deleted for h in t.history() if a < h.version <= b)
    return out


def best(fn, repeat: int) -> tuple[float, Any]:  # type: ignore[no-untyped-def]
    """The fastest of ``repeat`` calls, each with the decoded row-group cache emptied first (the series measure decoding)."""
    times, value = [], None
    for _ in range(repeat):
        decoded_cache.clear()
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return min(times), value


def measure_feed(t: lineage.Table, a: int, b: int, repeat: int) -> dict[str, Any]:
    load = os.getloadavg()[0]
    per_s, feed = best(lambda: cdf.changes(t, a, b), repeat)
    net_s, net = best(lambda: cdf.changes(t, a, b, net=True), repeat)
    # where the per-version feed's time goes (the same calls cdf.changes makes)
    state = t.state()
    ptr_s, pointers = best(lambda: change_pointers(state, a, b), repeat)
    shown = plan.per_version(pointers, a, b).pointer  # the images the feed shows: their values are read
    val_s, _ = best(lambda: image_values(state, pointers, shown, t.arrow_schema), repeat)
    files = {p.path for p in state.live_files()}
    ptr_files = {pointers.files[int(s)] for s in np.unique(pointers.source[shown]) if s >= 0}
    data_bytes = sum(s for p, s in files_under(local_path(t.iceberg.metadata.location)).items() if "/data/" in p and not p.endswith("-deletes.parquet"))
    return {
        "range": [a, b],
        "feed_s": round(per_s, 3),
        "net_s": round(net_s, 3),
        "feed_rows": feed.num_rows,
        "net_rows": net.num_rows,
        "pointers_s": round(ptr_s, 3),
        "values_s": round(val_s, 3),
        "pointers": len(pointers),
        "files_read_for_values": len(ptr_files),
        "live_files": len(files),
        "data_bytes_on_disk": data_bytes,
        "load1": round(load, 2),
        **index_bytes(t, a, b),
    }


def table_series(args: argparse.Namespace, workdir: str) -> list[dict[str, Any]]:
    out = []
    for rows in args.sizes:
        root = os.path.join(workdir, f"size-{rows}")
        t, built = build(root, rows, args.append_rows, args.commits, args.updates, args.deletes)
        r = {"rows": rows, **built, **measure_feed(t, built["base_version"], t.version, args.repeat)}
        out.append(r)
        print(f"  {rows:>11,} rows: feed {r['feed_s']:.3f}s net {r['net_s']:.3f}s ({r['feed_rows']:,} rows; pointers {r['pointers_s']:.3f}s, "
              f"values {r['values_s']:.3f}s from {r['files_read_for_values']} files); index {r['index_bytes']:,} B for {r['removed_images']:,} "
              f"removed images; load {r['load1']}", flush=True)
        shutil.rmtree(root, ignore_errors=True)
    return out


def volume_series(args: argparse.Namespace, workdir: str) -> list[dict[str, Any]]:
    root = os.path.join(workdir, "volume")
    t, built = build(root, args.fixed_rows, args.append_rows, args.volume_commits, args.updates, args.deletes)
    end = t.version
    out = []
    for k in sorted({k for k in (1, 2, 5, 10, 20, args.volume_commits) if k <= args.volume_commits}):
        r = {"table_rows": args.fixed_rows, "commits_in_range": k, **measure_feed(t, end - k, end, args.repeat)}
        out.append(r)
        print(f"  last {k:>2} commits ({r['removed_images']:>7,} removed images): feed {r['feed_s']:.3f}s net {r['net_s']:.3f}s "
              f"({r['feed_rows']:,} rows; pointers {r['pointers_s']:.3f}s, values {r['values_s']:.3f}s); index {r['index_bytes']:,} B; load {r['load1']}", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    return out


def print_summary(doc: dict[str, Any]) -> None:
    if doc.get("by_table_size"):
        print("\n| table rows | feed s | net s | feed rows | pointers s | values s | files read | index bytes | removed images | change commit s (mean) | load |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in doc["by_table_size"]:
            mean = sum(r["change_commit_s"]) / max(1, len(r["change_commit_s"]))
            print(f"| {r['rows']:,} | {r['feed_s']:.3f} | {r['net_s']:.3f} | {r['feed_rows']:,} | {r['pointers_s']:.3f} | {r['values_s']:.3f} | "
                  f"{r['files_read_for_values']} | {r['index_bytes']:,} | {r['removed_images']:,} | {mean:.2f} | {r['load1']} |")
    if doc.get("by_change_volume"):
        print("\n| commits in range | removed images | feed s | net s | feed rows | pointers s | values s | index bytes | load |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in doc["by_change_volume"]:
            print(f"| {r['commits_in_range']} | {r['removed_images']:,} | {r['feed_s']:.3f} | {r['net_s']:.3f} | {r['feed_rows']:,} | "
                  f"{r['pointers_s']:.3f} | {r['values_s']:.3f} | {r['index_bytes']:,} | {r['load1']} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000000,2000000,5000000,10000000", help="table sizes of series 1 (comma-separated)")
    parser.add_argument("--append-rows", type=int, default=1_000_000, help="rows per append when loading (default 1,000,000)")
    parser.add_argument("--commits", type=int, default=10, help="change commits of series 1 (default 10)")
    parser.add_argument("--updates", type=int, default=5_000, help="rows updated per change commit (default 5,000)")
    parser.add_argument("--deletes", type=int, default=1_000, help="rows deleted per change commit (default 1,000)")
    parser.add_argument("--fixed-rows", type=int, default=1_000_000, help="table size of series 2 (default 1,000,000)")
    parser.add_argument("--volume-commits", type=int, default=20, help="change commits of series 2 (default 20)")
    parser.add_argument("--repeat", type=int, default=3, help="feed timings are the best of this many runs (default 3)")
    parser.add_argument("--skip-size", action="store_true", help="skip series 1")
    parser.add_argument("--skip-volume", action="store_true", help="skip series 2")
    record.add_arguments(parser)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-scaling-")
    rec = record.Recorder("scaling", scale=max(args.sizes, default=args.fixed_rows), argv=argv, settings=vars(args))
    doc: dict[str, Any] = {}
    try:
        if not args.skip_size:
            print(f"series 1: table size grows, {args.commits} commits of {args.updates:,} updates + {args.deletes:,} deletes", flush=True)
            doc["by_table_size"] = table_series(args, workdir)
        if not args.skip_volume:
            print(f"series 2: change volume grows, table of {args.fixed_rows:,} rows", flush=True)
            doc["by_change_volume"] = volume_series(args, workdir)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print_summary(doc)
    path = rec.finish(doc, publish=args.publish, out=args.out)
    print(f"record written to {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
