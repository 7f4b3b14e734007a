"""A large run on one machine: delete, update, upsert, change feed and a full scan of a big table, three ways.

The table has ``--rows`` rows (default 100,000,000) in 5 columns (``id`` the key, ``bucket`` 0-99 at random,
``amount``, ``name``, ``qty``), appended ``--append-rows`` rows at a time (one data file per million rows) and
its key index built. It is built once under ``--data-dir`` (kept outside the repository; later runs with the
same ``--rows`` reuse it), with a copy made by the reference engine (Spark 3.5 + Iceberg 1.10, merge-on-read:
``tests/reference``) from the same data files, and the upsert batch (``--upsert-rows``, 1,000,000 by default
at every size, at most half the rows: half of them keys the table has, half new keys) as a Parquet file.

Then, for each system, from the same starting snapshot:

* ``spark``: this library on a local Spark session with 2 cores (``engine="spark"``; the upsert batch is a
  Spark DataFrame read by executors): ``delete("bucket = 0")``, ``update("bucket = 1", amount + 1)``, the
  upsert, the change feed of those three commits (``cdf.changes(engine="spark")`` written to Spark's ``noop``
  sink, which computes every row and column) and a full scan (``to_spark`` to the ``noop`` sink);
* ``embedded``: the same writes in this process (DuckDB), the feed with ``cdf.change_batches`` and the scan
  with ``Table.scan_batches``, both read to the end batch by batch;
* ``reference``: Spark SQL ``DELETE``, ``UPDATE`` and ``MERGE INTO`` (reading the same Parquet batch) in the
  reference engine, then a full scan (an aggregate over a hash of every column).

Each system runs in a fresh Python process of its own (this script again, with ``--child``), as a user's job
would: one process runs its writes, feed and scan one after the other, and no system's memory carries over into
the next one's steps. Each starts from the starting snapshot: ours through a copy of the catalog in a temporary
folder pointed at the starting metadata file (every file a run writes has a fresh name, so the next run shares
nothing with it, and the catalog under ``--data-dir`` is left as it was), the reference copy by Iceberg's
``rollback_to_snapshot``. The systems' steps and outcomes are merged into one record.

Per step: wall time; the peak RSS of the Python process that drives it (ours: the system's process, the
kernel's high-water mark reset per step, and what it holds after the step, anonymous and file-backed; the
reference: its server's Python process, sampled); the peak RSS of the
JVM and of Spark's Python workers (sampled every 0.1 s: ``large_measure.TreeSampler``); the bytes written, by
kind. Per size, what grows with the table: data, manifests, lineage segments, deleted-rows index, key index,
and the driver's planning memory (a fresh process: ``large_measure.planning_memory``).

    .venv/bin/python benchmarks/large.py --rows 10000000 --data-dir ~/lineage-large [--publish]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))

import cdf  # noqa: E402
import lineage  # noqa: E402
import large_measure as lm  # noqa: E402
import record  # noqa: E402
from lineage.memory import release_at_end  # noqa: E402

NAME = "bench.large"
SCHEMA = pa.schema([("id", pa.int64()), ("bucket", pa.int32()), ("amount", pa.float64()), ("name", pa.string()), ("qty", pa.int64())])
COLUMNS = ", ".join(SCHEMA.names)
DELETE_WHERE, UPDATE_WHERE, UPDATE_SET = "bucket = 0", "bucket = 1", {"amount": "amount + 1"}
SYSTEMS = ("embedded", "spark", "reference")  # each in a process of its own (see run_system)
SEED = 33
UPSERT_ROWS = 1_000_000  # the upsert batch, the same at every size so that its memory compares between sizes
SMALL_GROUP = 16 << 20  # a second embedded scan reads 16 MiB of Parquet per group instead of the default 128 MiB


# ----------------------------------------------------------------------------- the table, built once
def chunk(ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    """Rows for ``ids``: a random bucket 0-99, a random amount and quantity, a name derived from the id."""
    n = len(ids)
    names = pc.binary_join_element_wise("n", pc.cast(pa.array(ids % 1_000_003), pa.string()), "")
    return pa.table({"id": pa.array(ids, pa.int64()), "bucket": pa.array(rng.integers(0, 100, n, dtype=np.int32)),
                     "amount": pa.array(np.round(rng.random(n) * 1000, 2)), "name": names,
                     "qty": pa.array(rng.integers(1, 100, n, dtype=np.int64))}, schema=SCHEMA)


def folders(data_dir: str, rows: int) -> dict[str, str]:
    """Where a size's table, reference copy, upsert batch and build facts live under ``data_dir``."""
    root = os.path.join(data_dir, record.scale_label(rows))
    return {"root": root, "ours": os.path.join(root, "ours"), "reference": os.path.join(root, "reference"),
            "batch": os.path.join(root, "upsert.parquet"), "info": os.path.join(root, "build.json"),
            "table": os.path.join(root, "ours", *NAME.split("."))}


def build_ours(places: dict[str, str], rows: int, append_rows: int) -> dict[str, Any]:
    """Our table (appends, then the key index) and the upsert batch; the figures of the build."""
    rng = np.random.default_rng(SEED)
    shutil.rmtree(places["ours"], ignore_errors=True)
    t = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=places["ours"])
    start = time.perf_counter()
    for lo in range(0, rows, append_rows):
        t.append(chunk(np.arange(lo, min(rows, lo + append_rows), dtype=np.int64), rng))
    appended = time.perf_counter() - start
    t.reindex()
    indexed = time.perf_counter() - start - appended
    return {"rows": rows, "append_rows": append_rows, "append_s": round(appended, 1), "reindex_s": round(indexed, 1),
            "base_version": t.version, "base_metadata": t.iceberg.metadata_location}


def write_batch(places: dict[str, str], rows: int, n: int) -> dict[str, int]:
    """The upsert batch of ``n`` rows (half of them keys the table has, half new keys) as Parquet; its figures."""
    rng = np.random.default_rng(SEED + n)
    old = np.sort(rng.choice(rows, n // 2, replace=False)).astype(np.int64)
    new = np.arange(rows, rows + n - len(old), dtype=np.int64)
    batch = chunk(np.concatenate([old, new]), rng)
    pq.write_table(batch, places["batch"])
    return {"upsert_rows": batch.num_rows, "upsert_existing": len(old)}


def measure_base(places: dict[str, str], info: dict[str, Any]) -> dict[str, Any]:
    """What grows with the table, at the starting snapshot: the files it refers to, the files on disk, the
    driver's planning memory and a key index rebuild (time, memory), each in a fresh process."""
    t = reset_ours(places, info)
    out = {"sizes": lm.referenced_sizes(t), "on_disk": lm.table_sizes(record.files_under(places["table"])),
           "planning": lm.planning_memory(REPO, places["ours"], NAME), "reindex": lm.reindex_memory(REPO, places["ours"], NAME)}
    reset_ours(places, info)  # the rebuild committed
    return out


def build_reference(ref: Any, places: dict[str, str], info: dict[str, Any]) -> dict[str, Any]:
    """The reference engine's copy: a merge-on-read format v2 table filled from our data files by Spark."""
    wh = places["reference"]
    shutil.rmtree(wh, ignore_errors=True)
    os.makedirs(wh)
    start = time.perf_counter()
    ref.sql(wh, "CREATE NAMESPACE IF NOT EXISTS bench")
    ref.sql(wh, f"CREATE TABLE {NAME} (id BIGINT, bucket INT, amount DOUBLE, name STRING, qty BIGINT) USING iceberg TBLPROPERTIES "
                "('format-version'='2', 'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
                "'write.merge.mode'='merge-on-read')")
    files = [f.path for f in reset_ours(places, info).state().live_files()]  # our starting snapshot's
    union = " UNION ALL ".join(f"SELECT {COLUMNS} FROM parquet.`{lineage_path(p)}`" for p in files)
    ref.sql(wh, f"INSERT INTO {NAME} SELECT * FROM ({union}) ORDER BY id")
    snap = ref.sql(wh, f"SELECT snapshot_id FROM {NAME}.snapshots ORDER BY committed_at DESC LIMIT 1").column(0)[0].as_py()
    return {"reference_snapshot": snap, "reference_build_s": round(time.perf_counter() - start, 1),
            "reference_sizes": lm.table_sizes(record.files_under(wh))}


def lineage_path(path: str) -> str:
    """A data file's location as a local path (Spark's ``parquet.`...` `` takes paths)."""
    from lineage.storage.fileio import local_path

    return local_path(path)


def reset_ours(places: dict[str, str], info: dict[str, Any], warehouse: str | None = None) -> lineage.Table:
    """Point the catalog back at the starting metadata file and open the table afresh.

    With ``warehouse`` (an empty folder) the catalog under ``--data-dir`` is copied there first and the copy is
    the one pointed back: a system's run commits to its own catalog and leaves the shared one as it was.
    """
    namespace, name = NAME.split(".")
    shared = os.path.join(places["ours"], "catalog.db")
    if warehouse is not None:
        with sqlite3.connect(shared) as src, sqlite3.connect(os.path.join(warehouse, "catalog.db")) as dst:
            src.backup(dst)
    with sqlite3.connect(shared if warehouse is None else os.path.join(warehouse, "catalog.db")) as con:
        con.execute("UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = NULL "
                    "WHERE table_namespace = ? AND table_name = ?", (info["base_metadata"], namespace, name))
    t = lineage.open_table(NAME, warehouse=warehouse or places["ours"])
    assert t.version == info["base_version"], (t.version, info["base_version"])
    return t


# ----------------------------------------------------------------------------- measuring one step
class Steps:
    """Runs steps and records wall time, Python and JVM peak RSS, and the bytes written under a folder, by kind."""

    def __init__(self, rss: record.PeakRss) -> None:
        self.rss = rss
        self.rows: list[dict[str, Any]] = []

    def run(self, system: str, step: str, fn: Callable[[], Any], *, root: str, tree: int, python: str = "self") -> Any:
        """``python``: ``self`` (this process's high-water mark) or ``tree`` (the tree's Python processes, sampled)."""
        before = record.files_under(root)
        # a long-running driver between jobs: what the previous step (and the batch it read) freed goes back to the
        # OS, so each step's peak is its own, not the allocators' retention of earlier ones
        release_at_end()
        sampler = lm.TreeSampler(tree, include_root=python == "tree").start()
        figures, value = record.measure(fn, self.rss)
        memory = sampler.stop()
        written = lm.table_sizes(lm.new_files(before, record.files_under(root)))
        if system == "embedded":  # no JVM works for it (one left over by a stopped Spark session would count otherwise)
            memory = {k: 0.0 for k in memory}
        row = {"system": system, "step": step, "wall_s": round(figures["wall_s"], 2), "cpu_s": figures["cpu_s"],
               "load1": figures["load1"],
               "python_peak_mb": figures["peak_rss_mb"] if python == "self" else memory.get("python_peak_mb", 0.0),
               "python_before_mb": figures["rss_before_mb"] if python == "self" else None,
               # what this process holds after the step, anonymous and file-backed (memory-mapped files, such as
               # the key index's segments: pages the kernel may drop, counted in the peak all the same)
               **(held_after() if python == "self" else {}),
               "jvm_peak_mb": memory.get("jvm_peak_mb", 0.0), "workers_peak_mb": memory.get("worker_peak_mb", 0.0),
               "executor_peak_mb": memory.get("executor_peak_mb", 0.0),
               "bytes_written": sum(v["bytes"] for v in written.values()),
               "written": {k: v for k, v in written.items() if v["files"]}}
        if isinstance(value, dict):
            row.update(value)
        self.rows.append(row)
        print(f"{system:9s} {step:8s} {row['wall_s']:8.2f} s  python {row['python_peak_mb']:7.0f} MB  "
              f"jvm {row['jvm_peak_mb']:6.0f} MB  workers {row['workers_peak_mb']:6.0f} MB  written {row['bytes_written'] / 1e6:8.1f} MB"
              f"  load {figures['load1']:.1f}", flush=True)
        return value


def held_after() -> dict[str, float]:
    """This process's resident memory now, anonymous and file-backed, in MB (Linux; empty elsewhere)."""
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("RssAnon", "RssFile"):
                    out[f"python_after_{key[3:].lower()}_mb"] = round(int(value.split()[0]) / 1024, 1)
    except OSError:
        pass
    return out


def drain(reader: pa.RecordBatchReader) -> dict[str, Any]:
    """Read a stream to the end, one batch at a time; its rows, batches and the sum of ``amount``."""
    rows = batches = 0
    total = 0.0
    for batch in reader:
        rows += batch.num_rows
        batches += 1
        total += pc.sum(batch.column("amount")).as_py() or 0.0
    return {"rows": rows, "batches": batches, "amount_sum": round(total, 2)}


def spark_session(memory: str) -> Any:
    """A local Spark session with 2 cores, set up like the reference engine's."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("lineage-large").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
             .config("spark.driver.memory", memory).config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def noop(df: Any) -> None:
    """Compute every row and column of a Spark DataFrame and keep nothing (Spark's ``noop`` sink)."""
    df.write.format("noop").mode("overwrite").save()


def warm_up(spark: Any, t: lineage.Table) -> None:
    """Not timed: the JVM's first jobs and Spark's Python workers started with this library imported, as in a
    long-running job (the reference engine's server is warm too, and needs no Python workers)."""

    def import_in_worker(batches: Any) -> Any:  # nested: pickled by value (workers cannot import this script)
        import lineage.duck  # noqa: F401  (what the write paths' tasks import)
        import lineage.spark_match  # noqa: F401
        import lineage.writes.spark_removed  # noqa: F401

        yield from batches

    noop(t.to_spark(spark))
    spark.range(0, 1000, 1, 2).mapInArrow(import_in_worker, "id long").collect()


def run_spark(steps: Steps, places: dict[str, str], info: dict[str, Any], warehouse: str, memory: str) -> dict[str, Any]:
    """Our Spark path from the starting snapshot (catalog in ``warehouse``); the live rows, feed rows and sum of ``amount`` after it."""
    spark = spark_session(memory)
    t = reset_ours(places, info, warehouse)
    base = t.version
    me, root = os.getpid(), places["table"]
    batch = spark.read.parquet(places["batch"])
    warm_up(spark, t)
    steps.run("spark", "delete", lambda: {"rows_changed": t.delete(DELETE_WHERE, engine="spark", spark=spark).deleted}, root=root, tree=me)
    steps.run("spark", "update", lambda: {"rows_changed": t.update(UPDATE_WHERE, UPDATE_SET, engine="spark", spark=spark).updated},
              root=root, tree=me)

    def upsert() -> dict[str, int]:
        info_ = t.upsert(batch)
        return {"rows_changed": info_.updated + info_.inserted, "updated": info_.updated, "inserted": info_.inserted}

    steps.run("spark", "upsert", upsert, root=root, tree=me)
    feed: list[Any] = []

    def read_feed() -> None:  # planned inside the step: the plan's time and the driver's memory count
        feed.append(cdf.changes(t, base, engine="spark", spark=spark))
        noop(feed[0])

    steps.run("spark", "feed", read_feed, root=root, tree=me)
    feed_rows = feed.pop().count()
    steps.run("spark", "scan", lambda: noop(t.to_spark(spark)), root=root, tree=me)
    from pyspark.sql import functions as F

    amount = t.to_spark(spark).agg(F.sum("amount")).collect()[0][0]
    out = {"live_rows": t.count(), "feed_rows": feed_rows, "version": t.version, "amount_sum": round(amount, 2)}
    spark.stop()
    return out


def run_embedded(steps: Steps, places: dict[str, str], info: dict[str, Any], warehouse: str) -> dict[str, Any]:
    """Our embedded engine from the starting snapshot (catalog in ``warehouse``); what :func:`run_spark` returns, and the sizes after it."""
    t = reset_ours(places, info, warehouse)
    base = t.version
    me, root = os.getpid(), places["table"]
    steps.run("embedded", "delete", lambda: {"rows_changed": t.delete(DELETE_WHERE).deleted}, root=root, tree=me)
    steps.run("embedded", "update", lambda: {"rows_changed": t.update(UPDATE_WHERE, UPDATE_SET).updated}, root=root, tree=me)

    def upsert() -> dict[str, int]:
        info_ = t.upsert(pq.read_table(places["batch"]))
        return {"rows_changed": info_.updated + info_.inserted, "updated": info_.updated, "inserted": info_.inserted}

    steps.run("embedded", "upsert", upsert, root=root, tree=me)
    feed = steps.run("embedded", "feed", lambda: drain(cdf.change_batches(t, base)), root=root, tree=me)
    scan = steps.run("embedded", "scan", lambda: drain(t.scan_batches()), root=root, tree=me)
    steps.run("embedded", "scan-16m", lambda: drain(t.scan_batches(group_bytes=SMALL_GROUP)), root=root, tree=me)
    return {"live_rows": scan["rows"], "feed_rows": feed["rows"], "version": t.version, "amount_sum": scan["amount_sum"],
            "planning_after": lm.planning_memory(REPO, warehouse, NAME), "sizes_after": lm.referenced_sizes(t)}


def run_reference(steps: Steps, ref: Any, places: dict[str, str], info: dict[str, Any]) -> dict[str, Any]:
    """The reference engine's DELETE, UPDATE, MERGE and scan from its starting snapshot; its live rows and sum of ``amount``."""
    wh = places["reference"]
    ref.sql(wh, f"CALL system.rollback_to_snapshot(table => '{NAME}', snapshot_id => {info['reference_snapshot']})")
    ref.sql(wh, f"SELECT count(*) FROM {NAME}")  # warm-up, not timed, as ours
    pid = ref._proc.popen.pid  # the server (Python) and its JVM below it

    def sql(statement: str) -> Callable[[], None]:
        return lambda: ref.sql(wh, statement) and None

    def summary() -> dict[str, Any]:  # what the last step committed (Iceberg's snapshot summary), not timed
        s = ref.sql(wh, f"SELECT summary FROM {NAME}.snapshots ORDER BY committed_at DESC LIMIT 1").column(0)[0].as_py()
        s = dict(s) if not isinstance(s, dict) else s
        keep = ("added-position-deletes", "added-records", "deleted-records", "added-data-files", "added-delete-files")
        steps.rows[-1].update({k: int(v) for k, v in s.items() if k in keep})

    steps.run("reference", "delete", sql(f"DELETE FROM {NAME} WHERE {DELETE_WHERE}"), root=wh, tree=pid, python="tree")
    summary()
    steps.run("reference", "update", sql(f"UPDATE {NAME} SET amount = amount + 1 WHERE {UPDATE_WHERE}"), root=wh, tree=pid, python="tree")
    summary()
    steps.run("reference", "upsert", sql(f"MERGE INTO {NAME} t USING (SELECT * FROM parquet.`{places['batch']}`) s ON t.id = s.id "
                                         "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"), root=wh, tree=pid, python="tree")
    summary()
    steps.run("reference", "scan", sql(f"SELECT count(*) AS n, sum(hash({COLUMNS})) AS h FROM {NAME}"), root=wh, tree=pid, python="tree")
    live, amount = ref.sql(wh, f"SELECT count(*), sum(amount) FROM {NAME}").to_pylist()[0].values()
    return {"live_rows": live, "amount_sum": round(amount, 2)}


# ----------------------------------------------------------------------------- one process per system
def run_system(system: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``system`` in a fresh Python process (this script with ``--child``); its steps and outcome.

    A process per system, not per step: a user's job runs its writes, feed and scan in one long-running
    process (one Spark session), and the feed reads what the writes committed.
    """
    with tempfile.TemporaryDirectory(prefix="lineage-large-") as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--rows", str(args.rows), "--data-dir", args.data_dir,
               "--append-rows", str(args.append_rows), "--spark-memory", args.spark_memory,
               "--upsert-rows", str(args.upsert_rows), "--buckets", str(args.buckets), "--child", system, "--child-out", out]
        done = subprocess.run(cmd, check=False)
        if done.returncode != 0 or not os.path.exists(out):
            raise SystemExit(f"{system}: its process failed (exit {done.returncode})")
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def run_child(system: str, args: argparse.Namespace, places: dict[str, str], info: dict[str, Any]) -> int:
    """In the system's own process: run it on a private copy of the catalog; write its steps and outcome to ``--child-out``."""
    steps = Steps(record.PeakRss())
    warehouse = tempfile.mkdtemp(prefix="lineage-large-catalog-")
    ref, versions = None, None
    try:
        if system == "spark":
            out = run_spark(steps, places, info, warehouse, args.spark_memory)
        elif system == "embedded":
            out = run_embedded(steps, places, info, warehouse)
        else:
            from reference import ReferenceEngine

            ref = ReferenceEngine(driver_memory=args.spark_memory, request_timeout=3600.0)
            out = run_reference(steps, ref, places, info)
            versions = ref.versions
    finally:
        if ref is not None:
            ref.close()
        shutil.rmtree(warehouse, ignore_errors=True)
    out["process"] = os.getpid()
    with open(args.child_out, "w", encoding="utf-8") as f:
        json.dump({"steps": steps.rows, "outcome": out, "reference_versions": versions}, f)
    return 0


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    """Build the table if needed, run the systems, write the record; 1 if the systems' results differ."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000_000)
    parser.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "lineage-large"),
                        help="where the table is built once and kept (outside the repository)")
    parser.add_argument("--append-rows", type=int, default=1_000_000, help="rows per append when building (one data file each)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    parser.add_argument("--spark-memory", default="4g", help="spark.driver.memory of our session and of the reference engine")
    parser.add_argument("--upsert-rows", type=int, default=0,
                        help=f"rows of the upsert batch, half of them keys the table has: {UPSERT_ROWS:,} by default (at most "
                             "half the table), the same at every size so that its memory compares between sizes")
    parser.add_argument("--rebuild", action="store_true", help="build the table again even if --data-dir has it")
    parser.add_argument("--buckets", type=int, default=1, choices=range(1, 51), metavar="1-50",
                        help="buckets (1%% of the rows each) the delete and the update match: 1 by default; more to see "
                             "how memory grows with the matched rows on a smaller table")
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)  # run one system (see run_system)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    record.add_arguments(parser)
    args = parser.parse_args(argv)
    global DELETE_WHERE, UPDATE_WHERE
    if args.buckets > 1:
        DELETE_WHERE, UPDATE_WHERE = f"bucket < {args.buckets}", f"bucket >= {args.buckets} AND bucket < {2 * args.buckets}"
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or args.rows < 1000:
        parser.error(f"unknown systems {unknown}" if unknown else "--rows must be at least 1000")
    rec = None if args.child else record.Recorder("large", scale=args.rows, argv=argv, settings={**vars(args), "data_dir": None},
                                                  peers=["pyspark"])
    places = folders(os.path.abspath(os.path.expanduser(args.data_dir)), args.rows)  # the reference server runs elsewhere
    os.makedirs(places["root"], exist_ok=True)
    info = json.load(open(places["info"], encoding="utf-8")) if os.path.exists(places["info"]) and not args.rebuild else {}
    built_now = not info
    if built_now and args.child:
        parser.error("--child runs on a table built already")
    if built_now:
        print(f"building {args.rows:,} rows under {places['root']}", flush=True)
        info = build_ours(places, args.rows, args.append_rows)
        json.dump(info, open(places["info"], "w", encoding="utf-8"))
    upsert_rows = args.upsert_rows or min(UPSERT_ROWS, args.rows // 2)
    if info.get("upsert_rows") != upsert_rows or not os.path.exists(places["batch"]):
        info.update(write_batch(places, args.rows, upsert_rows))
        json.dump(info, open(places["info"], "w", encoding="utf-8"))
    if "reindex" not in info:
        info.update(measure_base(places, info))
        json.dump(info, open(places["info"], "w", encoding="utf-8"))
    if args.child or rec is None:
        return run_child(args.child, args, places, info)
    if "reference" in systems and "reference_snapshot" not in info:
        from reference import ReferenceEngine

        ref = ReferenceEngine(driver_memory=args.spark_memory, request_timeout=3600.0)
        try:
            info.update(build_reference(ref, places, info))
        finally:
            ref.close()
        json.dump(info, open(places["info"], "w", encoding="utf-8"))
    print(f"table: {args.rows:,} rows, version {info['base_version']}, built {'now' if built_now else 'earlier'}; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    rows: list[dict[str, Any]] = []
    outcomes: dict[str, Any] = {}
    for system in systems:
        part = run_system(system, args)
        rows += part["steps"]
        rec.steps += [dict(r) for r in part["steps"]]
        outcomes[system] = part["outcome"]
        if part.get("reference_versions") is not None:
            outcomes["reference_versions"] = part["reference_versions"]
    live = {s: o["live_rows"] for s, o in outcomes.items() if isinstance(o, dict) and "live_rows" in o}
    feeds = {s: o["feed_rows"] for s, o in outcomes.items() if isinstance(o, dict) and "feed_rows" in o}
    sums = {s: o["amount_sum"] for s, o in outcomes.items() if isinstance(o, dict) and "amount_sum" in o}
    agree = len(set(live.values())) <= 1 and len(set(feeds.values())) <= 1 and (max(sums.values(), default=0) - min(sums.values(), default=0)) < 1e-6 * max(1.0, *map(abs, sums.values()))
    load = list(rec._sampler.samples)  # the load sampled every second so far
    cores = os.cpu_count() or 1
    results = {"rows": args.rows, "build": {k: v for k, v in info.items() if k != "base_metadata"}, "built_this_run": built_now,
               "steps": rows, "outcomes": outcomes, "live_rows": live, "feed_rows": feeds, "amount_sums": sums, "agree": agree,
               "memory_method": {"python": "ours: VmHWM of the system's own process (a fresh one per system), reset per step, "
                                           "after returning freed memory (lineage.memory.release_at_end); reference: its "
                                           "server's Python process, sampled", "jvm_and_workers": lm.TreeSampler.METHOD},
               "loaded": max(load) > cores, "load_above_cores_fraction": round(sum(x > cores for x in load) / len(load), 2)}
    path = rec.finish(results, publish=args.publish, out=args.out)
    print(f"live rows {live}, feed rows {feeds}, sums of amount {sums}, agree={agree}; record written to {os.path.relpath(path)}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
