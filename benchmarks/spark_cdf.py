"""Spark versus DuckDB change feed on the same table and range.

Builds (or reuses, with ``--warehouse``) a table of ``--rows`` rows in 5
appends followed by 4 commits that each update 0.2% and delete 0.05% of the
rows, then times ``cdf.changes`` over the last 8 commits (about 1% of the
table) with both engines, per-version and net (the median of ``--repeat``
reads; Spark's after one warm-up read in the same session), and checks that
they agree:
the two answers must hold the same rows in every column, as multisets (DuckDB's
``EXCEPT ALL`` both ways, after casting Spark's Arrow result to our schema). Any
difference is written to the record and makes the script exit with status 1.

    .venv/bin/python benchmarks/spark_cdf.py --rows 5000000 [--publish]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cdf  # noqa: E402
import lineage  # noqa: E402
import record  # noqa: E402
from lineage import duck  # noqa: E402


def multiset_difference(ours: pa.Table, theirs: pa.Table, sample: int = 5) -> dict:
    """Rows only in ``ours`` and only in ``theirs`` (every column, duplicates counted), with a few examples."""
    theirs = theirs.select(ours.column_names).cast(ours.schema)
    con = duck.connect()
    try:
        con.register("ours", ours)
        con.register("theirs", theirs)
        out = {}
        for name, a, b in (("only_duckdb", "ours", "theirs"), ("only_spark", "theirs", "ours")):
            diff = con.execute(f"SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b}").to_arrow_table()
            out[name] = diff.num_rows
            out[f"{name}_examples"] = diff.slice(0, sample).to_pylist()
    finally:
        con.close()
    out["identical"] = out["only_duckdb"] == 0 and out["only_spark"] == 0 and ours.num_rows == theirs.num_rows
    return out


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
        t.update(f"id IN ({', '.join(map(str, upd.tolist()))})", {"amount": "amount + 1"})
        t.delete(f"id IN ({', '.join(map(str, dele.tolist()))})")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--warehouse", default=None, help="reuse a table built by an earlier run")
    parser.add_argument("--repeat", type=int, default=5, help="timed reads per engine and mode after one warm-up (the median is reported)")
    record.add_arguments(parser)
    args = parser.parse_args(argv)
    rec = record.Recorder("spark_cdf", scale=args.rows, argv=argv, settings=vars(args), peers=["pyspark"])
    own_warehouse = args.warehouse is None
    warehouse = args.warehouse or tempfile.mkdtemp(prefix="spark-cdf-")
    try:
        t = lineage.open_table("bench.orders", warehouse=warehouse)
    except lineage.TableNotFoundError:
        t = rec.step("build", lambda: build(warehouse, args.rows))
    a = t.version - 8

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "4").config("spark.driver.memory", "4g")
             .config("spark.sql.session.timeZone", "UTC").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results: dict = {"rows": args.rows, "range": [a, t.version]}
    for net in (False, True):
        key = "net" if net else "per_version"
        duck_s, spark_s = [], []
        for i in range(args.repeat):
            ours = rec.step(f"{key}_duckdb_{i}", lambda net=net: cdf.changes(t, a, net=net))
            duck_s.append(rec.steps[-1]["wall_s"])
        rec.step(f"{key}_spark_warmup", lambda net=net: cdf.changes(t, a, net=net, engine="spark", spark=spark).count())  # JIT, caches
        for i in range(args.repeat):
            theirs = rec.step(f"{key}_spark_{i}", lambda net=net: cdf.changes(t, a, net=net, engine="spark", spark=spark).toArrow())
            spark_s.append(rec.steps[-1]["wall_s"])
        diff = multiset_difference(ours, theirs)
        results[key] = {"duckdb_s": float(np.median(duck_s)), "spark_s": float(np.median(spark_s)), "duckdb_runs_s": duck_s,
                        "spark_runs_s": spark_s, "rows": ours.num_rows, "spark_rows": theirs.num_rows, "columns": ours.column_names, **diff}
        print(f"{key:12s} duckdb {results[key]['duckdb_s']:7.2f}s  spark {results[key]['spark_s']:7.2f}s  rows {ours.num_rows:,} / {theirs.num_rows:,}  "
              f"identical={diff['identical']} (only duckdb {diff['only_duckdb']:,}, only spark {diff['only_spark']:,})")
    scanned = rec.step("full_scan_duckdb", lambda: t.scan())
    results["duckdb_full_scan_s"] = rec.steps[-1]["wall_s"]
    results["scan_rows"] = scanned.num_rows
    print(f"full scan (duckdb) {results['duckdb_full_scan_s']:.2f}s, {scanned.num_rows:,} rows")
    spark.stop()
    if own_warehouse:
        shutil.rmtree(warehouse, ignore_errors=True)
    path = rec.finish(results, publish=args.publish, out=args.out)
    print(f"record written to {os.path.relpath(path)}")
    if not (results["per_version"]["identical"] and results["net"]["identical"]):
        print("the Spark and DuckDB feeds differ (examples in the record)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
