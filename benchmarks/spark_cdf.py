"""Spark versus DuckDB change feed on the same table and range.

Builds (or reuses, with ``--warehouse``) a table of ``--rows`` rows in 5
appends followed by 4 commits that each update 0.2% and delete 0.05% of the
rows, then times ``cdf.changes`` over the last 8 commits (about 1% of the
table) with both engines, per-version and net, and checks that they agree.

    .venv/bin/python benchmarks/spark_cdf.py --rows 5000000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cdf  # noqa: E402
import lineage  # noqa: E402


def build(warehouse: str, rows: int) -> lineage.Table:
    rng = np.random.default_rng(42)
    schema = pa.schema([("id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()), ("qty", pa.int32())])
    t = lineage.create_table("bench.orders", schema, key=["id"], warehouse=warehouse, properties={"lineage.key.enforce": "false"})
    per = rows // 5
    for i in range(5):
        ids = np.arange(i * per, (i + 1) * per, dtype=np.int64)
        t.append(pa.table({"id": ids, "customer": pa.array(np.char.add("c", (ids % 100_000).astype(str))),
                           "amount": rng.random(per) * 100, "qty": rng.integers(1, 10, per).astype(np.int32)}, schema=schema))
    for _ in range(4):
        upd = rng.choice(rows, rows // 500, replace=False)
        dele = rng.choice(rows, rows // 2000, replace=False)
        t.update(f"id IN (SELECT unnest({upd.tolist()}))", {"amount": "amount + 1"})
        t.delete(f"id IN (SELECT unnest({dele.tolist()}))")
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--warehouse", default=None, help="reuse a table built by an earlier run")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "spark_cdf.json"))
    args = parser.parse_args()
    warehouse = args.warehouse or tempfile.mkdtemp(prefix="spark-cdf-")
    try:
        t = lineage.open_table("bench.orders", warehouse=warehouse)
    except lineage.TableNotFoundError:
        t = build(warehouse, args.rows)
    a = t.version - 8

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "4").config("spark.driver.memory", "4g")
             .config("spark.sql.session.timeZone", "UTC").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results = {"rows": args.rows, "range": [a, t.version]}
    for net in (False, True):
        start = time.perf_counter()
        ours = cdf.changes(t, a, net=net)
        duck_s = time.perf_counter() - start
        cdf.changes(t, a, net=net, engine="spark", spark=spark).count()  # warm-up (JIT, caches)
        start = time.perf_counter()
        theirs = cdf.changes(t, a, net=net, engine="spark", spark=spark).toArrow()
        spark_s = time.perf_counter() - start
        agree = theirs.num_rows == ours.num_rows and sorted(theirs.column("_row_id").to_pylist()) == sorted(ours.column("_row_id").to_pylist())
        key = "net" if net else "per_version"
        results[key] = {"duckdb_s": duck_s, "spark_s": spark_s, "rows": ours.num_rows, "agree": agree}
        print(f"{key:12s} duckdb {duck_s:7.2f}s  spark {spark_s:7.2f}s  rows {ours.num_rows:,}  agree={agree}")
    start = time.perf_counter()
    scanned = t.scan()
    results["duckdb_full_scan_s"] = time.perf_counter() - start
    print(f"full scan (duckdb) {results['duckdb_full_scan_s']:.2f}s, {scanned.num_rows:,} rows")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    spark.stop()


if __name__ == "__main__":
    main()
