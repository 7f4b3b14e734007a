"""Spark upserts: a lookup of the batch's keys in the key index versus a join with the table's key columns.

Builds two identical keyed tables of ``--rows`` rows (``--files`` appends,
so as many data files), then upserts the same Spark batch of ``--batch``
rows (half of them keys already in the table, half new) into each, one with
``strategy="lookup"`` and one with ``strategy="join"``, ``--repeat`` times
(alternating, a fresh batch each round), and prints the median time of each
and the ratio join / lookup. Both tables must end with the same rows.

``auto`` (what ``Table.upsert`` uses) picks the lookup for batches of at most
1M rows whatever their share of the table (``lineage.writes.spark_upsert``):
run with a ``--batch`` that is a large share of ``--rows`` to check that the
lookup still costs less.

    .venv/bin/python benchmarks/spark_upsert.py --rows 2000000 --batch 10000 --repeat 3
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
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import lineage  # noqa: E402
from lineage.writes import spark as spark_writes  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()), ("qty", pa.int32())])


def rows_of(ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    n = len(ids)
    return pa.table({"id": ids, "customer": pa.array([f"c{i % 5000}" for i in ids], pa.string()),
                     "amount": rng.random(n) * 100, "qty": rng.integers(1, 10, n, dtype=np.int32)}, schema=SCHEMA)


def build(warehouse: str, name: str, rows: int, files: int) -> lineage.Table:
    rng = np.random.default_rng(7)
    t = lineage.create_table(f"bench.{name}", SCHEMA, key=["id"], warehouse=warehouse)
    per = rows // files
    for i in range(files):
        t.append(rows_of(np.arange(i * per, (i + 1) * per, dtype=np.int64), rng))
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from conftest import local_spark_builder

    spark = local_spark_builder("spark-upsert-bench").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    warehouse = tempfile.mkdtemp(prefix="spark-upsert-")
    try:
        tables = {s: build(warehouse, s, args.rows, args.files) for s in ("lookup", "join")}
        rng = np.random.default_rng(11)
        times: dict[str, list[float]] = {"lookup": [], "join": []}
        for r in range(args.repeat):
            old = rng.choice(args.rows, args.batch // 2, replace=False).astype(np.int64)
            new = np.arange(args.rows + r * args.batch, args.rows + r * args.batch + args.batch - len(old), dtype=np.int64)
            batch = spark.createDataFrame(rows_of(np.concatenate([old, new]), rng)).cache()
            batch.count()
            for strategy in (("lookup", "join") if r % 2 == 0 else ("join", "lookup")):
                start = time.perf_counter()
                info = spark_writes.upsert(tables[strategy]._context, batch, lineage.MERGE_ON_READ, strategy)
                times[strategy].append(time.perf_counter() - start)
                assert (info.updated, info.inserted) == (len(old), len(new)), info
            batch.unpersist()
        a, b = (tables[s].scan(columns=["id", "customer", "amount", "qty"]).sort_by("id") for s in ("lookup", "join"))
        assert a.equals(b), "the two strategies left different rows"
        load = os.getloadavg()
        lookup, join = statistics.median(times["lookup"]), statistics.median(times["join"])
        print(f"table {args.rows:,} rows in {args.files} files, batch {args.batch:,} rows ({args.batch // 2:,} updates), "
              f"{args.repeat} rounds, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        print(f"lookup (key index): median {lookup:.2f} s  {[round(x, 2) for x in times['lookup']]}")
        print(f"join (key columns): median {join:.2f} s  {[round(x, 2) for x in times['join']]}")
        print(f"join / lookup: {join / lookup:.2f}x")
    finally:
        spark.stop()
        shutil.rmtree(warehouse, ignore_errors=True)


if __name__ == "__main__":
    main()
