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

    .venv/bin/python benchmarks/stream_upkeep.py --commits 200 --maintain-every 0,25 --publish

Prints, for each ``--maintain-every`` setting (one stream each, in this order), p50 of all commits, of the
first and the last 50, p99, and the median time of one ``maintain()``, and writes a record
(``benchmarks/record.py``; ``--publish`` puts it in ``benchmarks/results/``, where ``benchmarks/report.py``
renders it as the section ``stream-upkeep``). One run each: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import lineage  # noqa: E402
import record  # noqa: E402

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


def _settings(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be commit counts separated by commas, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"must be commit counts >= 0 separated by commas, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run one stream per setting, print one line each and write the record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--maintain-every", type=_settings, default=[0, 25],
                        help="commits between maintain() calls, comma separated, one stream each (0: never; default 0,25)")
    record.add_arguments(parser)
    args = parser.parse_args(argv)
    rec = record.Recorder("stream_upkeep", scale=args.rows, argv=argv, settings=vars(args))
    runs = []
    for every in args.maintain_every:
        with tempfile.TemporaryDirectory(prefix="bench-upkeep-") as tmp:
            r = run(args.rows, args.commits, every, tmp)
        runs.append({"maintain_every": every, **r})
        print(
            f"rows={args.rows:,} commits={args.commits} maintain-every={every} load={os.getloadavg()[0]:.2f}: "
            f"commit p50 {r['p50']:.0f} ms (first/last 50: {r['first']:.0f}/{r['last']:.0f}), p99 {r['p99']:.0f} ms; "
            f"maintain() {r['maintain_runs']} runs, median {r['maintain_s']:.2f} s", flush=True,
        )
    path = rec.finish({"rows": args.rows, "commits": args.commits, "window": min(50, args.commits), "runs": runs},
                      publish=args.publish, out=args.out)
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
