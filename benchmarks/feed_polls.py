"""A consumer polling the change feed one commit at a time, with the decoded row-group cache off and on.

An MV refresh job or a stream consumer reads ``changes(t, v - 1, v)`` for each
new commit ``v``. Each such feed shows the pre-images of the rows the commit
changed, and most of them live in the bulk load's row groups, which every poll
would decode again without the decoded row-group cache
(``LINEAGE_ROW_GROUP_CACHE_MB``, :mod:`lineage.decoded_cache`). This script
polls the last ``--polls`` commits of a table kept by ``benchmarks/run.py
--keep`` (``<workdir>/lineage``) in a fresh process per budget and setting, and
prints each poll's time, the median, and the ratio against the cache off.

    .venv/bin/python benchmarks/run.py --scale 1000000 --systems lineage --keep --workdir /some/dir
    .venv/bin/python benchmarks/feed_polls.py /some/dir/lineage --budgets 0,256,512

The first call of each process (over an older commit, outside the polled
ones) loads the table and warms the code; with the cache on it also decodes
row groups once, so that the first poll keeps them (a chunk is kept the second
time it is decoded) and the next ones find them kept, as a long-running
consumer would have.
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


def child(warehouse: str, polls: int) -> None:
    """Poll the last ``polls`` commits one at a time; print the times as JSON."""
    sys.path.insert(0, os.path.dirname(HERE))
    import cdf
    import lineage

    t = lineage.open_table("bench.orders", warehouse=warehouse)
    v = t.version
    cdf.changes(t, v - polls - 1, v - polls)
    times = []
    for k in range(v - polls, v):
        start = time.perf_counter()
        feed = cdf.changes(t, k, k + 1)
        times.append(time.perf_counter() - start)
        del feed
    print(json.dumps(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("warehouse", help="a table kept by run.py --keep: <workdir>/lineage")
    parser.add_argument("--budgets", default="0,256", help="LINEAGE_ROW_GROUP_CACHE_MB values to compare (0: off)")
    parser.add_argument("--polls", type=int, default=10, help="the last N commits are polled")
    parser.add_argument("--rounds", type=int, default=2, help="fresh processes per budget, alternating")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.warehouse, args.polls)
        return
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    medians: dict[str, list[float]] = {b: [] for b in budgets}
    for r in range(args.rounds):
        for b in budgets:
            env = {**os.environ, "LINEAGE_ROW_GROUP_CACHE_MB": b}
            out = subprocess.run([sys.executable, __file__, args.warehouse, "--polls", str(args.polls), "--child"], env=env,
                                 capture_output=True, text=True, check=True)
            times = json.loads(out.stdout.strip().splitlines()[-1])
            medians[b].append(statistics.median(times))
            print(f"round {r + 1}, cache {b:>4} MB: polls " + " ".join(f"{x:.3f}" for x in times) + f"  median {statistics.median(times):.3f} s", flush=True)
    base = statistics.median(medians[budgets[0]])
    for b in budgets:
        m = statistics.median(medians[b])
        print(f"cache {b:>4} MB: median poll {m:.3f} s, {base / m:.2f}x the speed with cache {budgets[0]} MB")


if __name__ == "__main__":
    main()
