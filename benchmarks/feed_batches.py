"""The whole change feed against the same feed streamed in batches: time and peak memory of a consumer.

A consumer that writes the feed somewhere (files, a queue, another table) does
not need it all in memory at once. ``cdf.change_batches`` plans the feed as
``cdf.changes`` does and reads the values one part at a time. This script
reads the feed (a) (the last ``--commits`` commits; per-version or
``--net``) of a table kept by ``benchmarks/run.py --keep``
(``<workdir>/lineage``) in a fresh process per setting, once as one table and
once per batch size, consuming each batch (row count and ``sum(id)``) and
dropping it. It prints the first call's time and peak RSS (the kernel's
high-water mark, reset before the call) above the process's resident size
before it, then the median time of the later calls.

    .venv/bin/python benchmarks/run.py --scale 10000000 --systems lineage --keep --workdir /some/dir
    .venv/bin/python benchmarks/feed_batches.py /some/dir/lineage --batches 1000000,250000

``LINEAGE_ROW_GROUP_CACHE_MB`` is passed on to the children (the decoded
row-group cache holds up to its budget in every setting; 0 shows the feed's
own memory).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def child(warehouse: str, commits: int, net: bool, batch_rows: int, calls: int) -> None:
    """Read the feed ``calls`` times (0 batch rows: as one table); print rows, sum(id), times and the first peak."""
    sys.path.insert(0, os.path.dirname(HERE))
    import pyarrow.compute as pc

    import cdf
    import lineage

    t = lineage.open_table("bench.orders", warehouse=warehouse)
    b = t.version
    a = b - commits
    out: dict = {"times": []}
    for call in range(calls):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_mb("VmRSS")
        start = time.perf_counter()
        rows = ids = 0
        if batch_rows == 0:
            feed = cdf.changes(t, a, b, net=net)
            rows, ids = feed.num_rows, pc.sum(feed.column("id")).as_py() or 0
            del feed
        else:
            for batch in cdf.change_batches(t, a, b, net=net, batch_rows=batch_rows):
                rows += batch.num_rows
                ids += pc.sum(batch.column("id")).as_py() or 0
        out["times"].append(time.perf_counter() - start)
        if call == 0:
            out.update(rows=rows, id_sum=ids, before_mb=before, peak_mb=_status_mb("VmHWM"))
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("warehouse", help="a table kept by run.py --keep: <workdir>/lineage")
    parser.add_argument("--batches", default="1000000,250000", help="batch_rows values to compare with the whole feed")
    parser.add_argument("--commits", type=int, default=25, help="the feed of the last N commits (run.py's feed (a): 25)")
    parser.add_argument("--net", action="store_true", help="net changes instead of per-version")
    parser.add_argument("--calls", type=int, default=3, help="feeds per process; the first is the measured one")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.warehouse, args.commits, args.net, args.child, args.calls)
        return
    settings = [0] + [int(x) for x in args.batches.split(",") if x.strip()]
    results = {}
    for rows in settings:
        cmd = [sys.executable, __file__, args.warehouse, "--commits", str(args.commits), "--calls", str(args.calls), "--child", str(rows)]
        out = subprocess.run(cmd + (["--net"] if args.net else []), capture_output=True, text=True, check=True)
        r = results[rows] = json.loads(out.stdout.strip().splitlines()[-1])
        what = "changes() (one table)" if rows == 0 else f"change_batches(batch_rows={rows:,})"
        later = statistics.median(r["times"][1:]) if len(r["times"]) > 1 else float("nan")
        print(f"{what:38s} rows {r['rows']:>10,}  first {r['times'][0]:6.2f} s, peak {r['peak_mb']:6.0f} MB "
              f"(+{r['peak_mb'] - r['before_mb']:.0f} over {r['before_mb']:.0f})  later calls {later:6.2f} s", flush=True)
    whole = results[0]
    for rows in settings[1:]:
        r = results[rows]
        if (r["rows"], r["id_sum"]) != (whole["rows"], whole["id_sum"]):
            raise SystemExit(f"batch_rows={rows}: {r['rows']} rows, sum(id) {r['id_sum']}; the whole feed has {whole['rows']}, {whole['id_sum']}")
        print(f"batch_rows={rows:,}: first-call peak growth {(r['peak_mb'] - r['before_mb']) / (whole['peak_mb'] - whole['before_mb']):.2f}x "
              f"the whole feed's, first call {r['times'][0] / whole['times'][0]:.2f}x its time")


if __name__ == "__main__":
    main()
