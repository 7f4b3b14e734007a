"""A long change stream with and without routine upkeep (issue 12): does ``maintain()`` keep the commit at its early cost?

Workload (fixed seed): a keyed table (``id`` int64 key, ``name`` string,
``amount`` float64) of ``--rows`` rows in one append, then ``--commits``
batches through ``Table.apply_changelog(batch, upsert=True)`` (position
strategy), each with 1,000 ``+U`` of random live keys, 200 ``-D`` of random
live keys and 800 ``+I`` of new keys. With ``--maintain-every N`` the stream
calls ``Table.maintain()`` after every N commits (compaction, delete rewrites,
key-index merges, expiry, as the table properties say); its time is reported
apart and is not part of the commit latency, as for a maintenance job that
runs beside the stream.

    .venv/bin/python benchmarks/stream_upkeep.py --commits 200 --maintain-every 0
    .venv/bin/python benchmarks/stream_upkeep.py --commits 200 --maintain-every 25

Prints p50 of all commits, of the first and the last 50, p99, and the median
time of one ``maintain()``. One run each: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import lineage  # noqa: E402

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()), pa.field("amount", pa.float64())])


def run(rows: int, commits: int, every: int, warehouse: str) -> dict[str, float]:
    """Stream ``commits`` batches into a fresh table; the latency figures in milliseconds."""
    t = lineage.create_table("bench.stream", SCHEMA, key=["id"], warehouse=warehouse)
    ids = np.arange(rows)
    t.append(pa.table({"id": ids, "name": [f"n{i}" for i in ids], "amount": ids.astype(float)}, schema=SCHEMA))
    rng = np.random.default_rng(7)
    live = np.zeros(rows + commits * 800, bool)
    live[:rows] = True
    nxt = rows
    latency, upkeep = [], []
    for c in range(commits):
        touched = rng.choice(np.flatnonzero(live[:nxt]), 1200, replace=False)
        upd, dels = touched[:1000], touched[1000:]
        ins = np.arange(nxt, nxt + 800)
        nxt += 800
        keys = np.concatenate([upd, dels, ins])
        ops = ["+U"] * len(upd) + ["-D"] * len(dels) + ["+I"] * len(ins)
        batch = pa.table({"_op": ops, "id": keys, "name": [f"x{k}" for k in keys], "amount": rng.random(len(keys))})
        start = time.perf_counter()
        t.apply_changelog(batch, upsert=True)
        latency.append((time.perf_counter() - start) * 1000)
        live[dels] = False
        live[ins] = True
        if every and (c + 1) % every == 0:
            start = time.perf_counter()
            t.maintain()
            upkeep.append(time.perf_counter() - start)
    assert t.count() == int(live.sum()), "the table's rows differ from the stream's"
    ms = np.array(latency)
    window = min(50, commits)
    return {
        "p50": float(np.median(ms)), "first": float(np.median(ms[:window])), "last": float(np.median(ms[-window:])),
        "p99": float(np.percentile(ms, 99)), "maintain_runs": len(upkeep), "maintain_s": float(np.median(upkeep)) if upkeep else 0.0,
    }


def main() -> None:
    """Parse the options, run the stream, print one line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--maintain-every", type=int, default=25, help="commits between maintain() calls (0: never)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-upkeep-") as tmp:
        r = run(args.rows, args.commits, args.maintain_every, tmp)
    print(
        f"rows={args.rows:,} commits={args.commits} maintain-every={args.maintain_every} load={os.getloadavg()[0]:.2f}: "
        f"commit p50 {r['p50']:.0f} ms (first/last 50: {r['first']:.0f}/{r['last']:.0f}), p99 {r['p99']:.0f} ms; "
        f"maintain() {r['maintain_runs']} runs, median {r['maintain_s']:.2f} s"
    )


if __name__ == "__main__":
    main()
