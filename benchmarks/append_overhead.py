"""The lineage cost of a bulk append (issue 16 item 3), and what a deferred key index moves to the first upsert.

One generated batch (the columns of ``run.py``: id, customer_id, status,
amount, ordered_at; ``--rows`` rows, fixed seed) is appended to a new, empty
table by:

* ``pyiceberg``: plain pyiceberg (``Table.append``), no lineage;
* ``lineage-keyless``: this product, a table without a key (row ids and
  versions only);
* ``lineage-keyed``: this product, key ``id`` (the key index's first
  segment, or none when the build is deferred, see the README's key index
  section);
* ``lineage-keyed-eager``: the same with ``lineage.key-index.defer-rows=0``
  (the first segment written by the append itself).

Each system runs in its own child process, ``--repeat`` times, systems
interleaved so that load changes hit all of them alike; per run: wall and CPU
time of the append, peak RSS of the process during it (VmHWM reset before
the append, so it includes the batch in memory). For the keyed tables the
child then runs ``--upserts`` upserts of 1,000 keys (half updates of random
live keys, half new keys) and reports the first one apart (with a deferred
index it builds and commits the index) and the median of the others, a bare
lookup of 1,000 keys (``KeyIndex.open`` + ``lookup``), and the key index's
bytes on disk per live key.

Printed: medians per system, ours minus pyiceberg's time as a fraction of
pyiceberg's, and the peak RSS ratio. The tables live in a temporary folder
(``--workdir`` to choose), removed at the end. Every run writes a record (``benchmarks/record.py``) with
each child run's figures; ``--publish`` puts it in ``benchmarks/results/``, where ``benchmarks/report.py``
renders it (sections ``append-overhead`` and ``append-overhead-summary``).

    .venv/bin/python benchmarks/append_overhead.py --rows 1000000 --repeat 3 --publish
    .venv/bin/python benchmarks/append_overhead.py --rows 10000000 --repeat 1 --upserts 4 --publish
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import record  # noqa: E402

SYSTEMS = ("pyiceberg", "lineage-keyless", "lineage-keyed", "lineage-keyed-eager")
SEED = 7
UPSERT_KEYS = 1000


def generate(rows: int) -> pa.Table:
    """The base rows of ``run.py``'s schema (ids 0..rows-1, in order, as a bulk load has them)."""
    from run import SCHEMA, STATUSES

    rng = np.random.default_rng(SEED)
    data = {
        "id": np.arange(rows, dtype=np.int64),
        "customer_id": rng.integers(0, 100_000, rows),
        "status": STATUSES[rng.integers(0, 4, rows)],
        "amount": np.round(rng.random(rows) * 1000, 2),
        "ordered_at": np.datetime64("2026-01-01T00:00:00", "us") + rng.integers(0, 10**13, rows).astype("timedelta64[us]"),
    }
    return pa.table({f.name: pa.array(data[f.name], f.type) for f in SCHEMA}, schema=SCHEMA)


def _upsert_batch(rng: np.random.Generator, live: int, next_id: int, template: pa.Table) -> pa.Table:
    half = UPSERT_KEYS // 2
    ids = np.concatenate([rng.choice(live, half, replace=False), np.arange(next_id, next_id + UPSERT_KEYS - half)])
    batch = template.slice(0, UPSERT_KEYS)
    return batch.set_column(0, "id", pa.array(ids, pa.int64()))


def child(system: str, rows: int, root: str, upserts: int) -> dict:
    """One append (and, keyed, the upserts and lookups) in this process; returns the measurements."""
    from run import SCHEMA

    data = generate(rows)
    rss = record.PeakRss()
    out: dict = {"system": system, "rows": rows}
    if system == "pyiceberg":
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = SqlCatalog("plain", uri=f"sqlite:///{os.path.join(root, 'catalog.db')}", warehouse=root)
        catalog.create_namespace_if_not_exists("bench")
        table = catalog.create_table(("bench", "orders"), schema=SCHEMA, properties={"format-version": "2"})
    else:
        import lineage

        props = {"lineage.key-index.defer-rows": "0"} if system == "lineage-keyed-eager" else None
        key = None if system == "lineage-keyless" else ["id"]
        table = lineage.create_table("bench.orders", SCHEMA, key=key, warehouse=root, properties=props)
    measured, _ = record.measure(lambda: table.append(data), rss)
    out["append"] = measured
    if system.startswith("lineage-keyed") and upserts > 0:  # --upserts 0: the append alone
        from index.key_index import KeyIndex

        rng = np.random.default_rng(SEED + 1)
        times = []
        next_id = rows
        for _ in range(upserts):
            batch = _upsert_batch(rng, rows, next_id, data)
            next_id += UPSERT_KEYS
            start = time.perf_counter()
            table.upsert(batch)
            times.append(time.perf_counter() - start)
        out["first_upsert_s"] = round(times[0], 4)
        out["upsert_median_s"] = round(statistics.median(times[1:]), 4) if len(times) > 1 else None
        state = table.state()
        keys = pa.table({"id": pa.array(rng.choice(rows, UPSERT_KEYS, replace=False), pa.int64())})
        lookups = []
        for _ in range(5):
            start = time.perf_counter()
            hits = KeyIndex.open(state).lookup(keys)
            lookups.append(time.perf_counter() - start)
        assert hits.num_rows == UPSERT_KEYS
        out["lookup_median_s"] = round(statistics.median(lookups), 4)
        paths = state.lineage.key_index or ()
        size = sum(os.path.getsize(p.removeprefix("file://")) for p in paths)
        out["index_bytes"] = size
        out["index_segments"] = len(paths)
        out["index_bytes_per_key"] = round(size / (rows + (upserts * (UPSERT_KEYS - UPSERT_KEYS // 2))), 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="child runs per system (default 3)")
    ap.add_argument("--upserts", type=int, default=6, help="1,000-key upserts after a keyed append (default 6)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--root", default=None, help=argparse.SUPPRESS)
    record.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.rows, args.root, args.upserts)), flush=True)
        return 0
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")
    rec = record.Recorder("append_overhead", scale=args.rows, argv=argv,
                          settings={k: v for k, v in vars(args).items() if k not in ("child", "root")})
    work = args.workdir or tempfile.mkdtemp(prefix="append-overhead-")
    results: dict[str, list[dict]] = {s: [] for s in systems}
    try:
        for r in range(args.repeat):
            for system in systems:
                root = os.path.join(work, f"{system}-{r}")
                os.makedirs(root)
                cmd = [sys.executable, os.path.abspath(__file__), "--child", system, "--rows", str(args.rows), "--root", root,
                       "--upserts", str(args.upserts)]
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                if proc.returncode or not line:
                    print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
                    raise SystemExit(f"{system} failed")
                res = json.loads(line[0][7:])
                results[system].append(res)
                a = res["append"]
                extra = "".join(f"  {k} {res[k]}" for k in ("first_upsert_s", "upsert_median_s", "lookup_median_s", "index_bytes_per_key") if k in res)
                print(f"{system:20s} run {r}: append {a['wall_s']:.3f} s  cpu {a['cpu_s']:.3f} s  peak {a['peak_rss_mb']:.0f} MB  load {a['load1']}{extra}", flush=True)
                shutil.rmtree(root)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    def med(system: str, field: str) -> float:
        return statistics.median(r["append"][field] for r in results[system])

    print(f"\nmedians over {args.repeat} run(s), {args.rows:,} rows, load average now {os.getloadavg()[0]:.2f}:")
    for system in systems:
        line = f"{system:20s} append {med(system, 'wall_s'):.3f} s  cpu {med(system, 'cpu_s'):.3f} s  peak {med(system, 'peak_rss_mb'):.0f} MB"
        if "pyiceberg" in results and system != "pyiceberg":
            base_w, base_c, base_m = (med("pyiceberg", f) for f in ("wall_s", "cpu_s", "peak_rss_mb"))
            line += (f"  | lineage cost: wall {(med(system, 'wall_s') - base_w) / base_w:+.0%}, cpu {(med(system, 'cpu_s') - base_c) / base_c:+.0%}"
                     f" of pyiceberg's; peak RSS {med(system, 'peak_rss_mb') / base_m:.2f}x")
        print(line)
        for k in ("first_upsert_s", "upsert_median_s", "lookup_median_s", "index_bytes_per_key"):
            vals = [r[k] for r in results[system] if r.get(k) is not None]
            if vals:
                print(f"{'':20s}   {k}: {statistics.median(vals)}")
    path = rec.finish({"rows": args.rows, "repeat": args.repeat, "upserts": args.upserts, "runs": results},
                      publish=args.publish, out=args.out)
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
