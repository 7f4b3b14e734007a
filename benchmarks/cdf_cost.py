"""Change-feed cost versus a full scan, and the index's write cost per deleted row.

Builds a table of ``--rows`` rows (default 5 million) in ``--files`` appends,
then ``--commits`` commits that each update ``--update-pct`` % and delete
``--delete-pct`` % of the rows at random, and reports:

* the time of a full ``scan()`` versus ``cdf.changes`` over the last commits
  (a range holding about 1% of the table in changes), per-version and net;
* bytes of deleted-rows index written per removed row image.

    .venv/bin/python benchmarks/cdf_cost.py --rows 5000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cdf  # noqa: E402
import lineage  # noqa: E402
import record  # noqa: E402


def timed(fn, repeat: int = 3):
    """Best-of-``repeat`` wall time, the median, every time, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(round(time.perf_counter() - start, 4))
    return min(times), statistics.median(times), times, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--files", type=int, default=5, help="number of initial appends (one data file each)")
    parser.add_argument("--commits", type=int, default=4)
    parser.add_argument("--update-pct", type=float, default=0.2)
    parser.add_argument("--delete-pct", type=float, default=0.05)
    record.add_arguments(parser)
    args = parser.parse_args(argv)
    rec = record.Recorder("cdf_cost", scale=args.rows, argv=argv, settings=vars(args))

    rng = np.random.default_rng(42)
    wh = tempfile.mkdtemp(prefix="cdf-cost-")
    schema = pa.schema([("id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()), ("qty", pa.int32())])
    t = lineage.create_table("bench.orders", schema, key=["id"], warehouse=wh)
    per = args.rows // args.files
    start = time.perf_counter()
    for i in range(args.files):
        ids = np.arange(i * per, (i + 1) * per, dtype=np.int64)
        t.append(pa.table({"id": ids, "customer": pa.array(np.char.add("c", (ids % 100_000).astype(str))),
                           "amount": rng.random(per) * 100, "qty": rng.integers(1, 10, per).astype(np.int32)}, schema=schema))
    print(f"loaded {args.rows:,} rows in {time.perf_counter() - start:.1f}s")

    base = t.version
    index_bytes = removed = 0
    for _ in range(args.commits):
        live = args.rows  # ids are never reused in this benchmark, deletes shrink the table a little
        upd = rng.choice(live, int(live * args.update_pct / 100), replace=False)
        dele = rng.choice(live, int(live * args.delete_pct / 100), replace=False)
        u = t.update(f"id IN ({', '.join(map(str, upd.tolist()))})", {"amount": "amount + 1"})
        d = t.delete(f"id IN ({', '.join(map(str, dele.tolist()))})")
        for c in (u, d):
            entry = next(e for e in t.state().lineage.commits if e.version == c.version)
            if entry.index:
                index_bytes += os.path.getsize(entry.index)
                removed += c.updated + c.deleted
    changed_rows = sum(h.updated + h.deleted for h in t.history() if h.version > base)

    scan_best, scan_med, scan_all, scanned = timed(lambda: t.scan())
    cdf_best, cdf_med, cdf_all, feed = timed(lambda: cdf.changes(t, base))
    net_best, net_med, net_all, net = timed(lambda: cdf.changes(t, base, net=True))
    results = {
        "rows": args.rows,
        "range_versions": t.version - base,
        "changed_rows_in_range": changed_rows,
        "changed_fraction": changed_rows / args.rows,
        "scan_s": scan_best,
        "cdf_s": cdf_best,
        "cdf_net_s": net_best,
        "cdf_over_scan": cdf_best / scan_best,
        "cdf_net_over_scan": net_best / scan_best,
        "feed_rows": feed.num_rows,
        "net_rows": net.num_rows,
        "scan_rows": scanned.num_rows,
        "index_bytes_per_removed_row": index_bytes / max(1, removed),
        "removed_rows_indexed": removed,
        "index_bytes": index_bytes,
        "times_s": {"scan": scan_all, "cdf": cdf_all, "cdf_net": net_all},
    }
    print(f"range: {results['range_versions']} versions, {changed_rows:,} changed rows "
          f"({100 * results['changed_fraction']:.2f}% of the table)")
    print(f"full scan       {scan_best:7.3f}s (median {scan_med:.3f}s) {scanned.num_rows:,} rows")
    print(f"changes()       {cdf_best:7.3f}s (median {cdf_med:.3f}s) {feed.num_rows:,} rows  -> {results['cdf_over_scan']:.3f} of a scan")
    print(f"changes(net)    {net_best:7.3f}s (median {net_med:.3f}s) {net.num_rows:,} rows  -> {results['cdf_net_over_scan']:.3f} of a scan")
    print(f"index write cost: {results['index_bytes_per_removed_row']:.2f} bytes per removed row image ({removed:,} images)")
    shutil.rmtree(wh, ignore_errors=True)
    path = rec.finish(results, publish=args.publish, out=args.out)
    print(f"record written to {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
