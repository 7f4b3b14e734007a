"""The change feed as a Spark Structured Streaming source (``cdf.spark.register_source``), in real streaming queries.

In-process queries (the shared session) check that micro-batches are the
per-version feed within the rate limits and ``Trigger.AvailableNow``'s
target, and the errors. ``test_kills_and_restarts_emit_every_change_once``
runs the query in a child process (``feed_stream_job.py``) while this
process commits, kills it with SIGKILL at random moments and right after
a sink wrote a batch, restarts it from its checkpoint, and checks that the
batches together are ``cdf.changes(t, start)`` row for row, in order.
"""

from __future__ import annotations

import glob
import json
import os
import random
import re
import threading
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.types import StringType
from conftest import SCHEMA, finish_job, kill_job, start_job
from feed_stream_job import MAX_VERSIONS, write_batch

import cdf
import cdf.spark
import lineage
from cdf.spark_source import SourceOptions
from lineage.errors import InvalidArgumentError, RetentionError

pytestmark = pytest.mark.spark

CAPTURE = "lineage.cdf.capture-preimages"


def _rows(ids: list[int], name: str = "n", amount: float = 1.0) -> pa.Table:
    return pa.table({"id": ids, "name": [name] * len(ids), "amount": [amount + i for i in ids]}, schema=SCHEMA)


def _history(t: lineage.Table) -> None:
    """Versions 1-8: captured pre-images, then read from files; copy-on-write, a compaction, a foreign append."""
    t.append(_rows(list(range(1, 7)), "a"))  # 1
    t.update("id % 2 = 0", {"amount": "amount + 1"})  # 2 (pre-images captured)
    t.delete("id = 3")  # 3
    with t.iceberg.transaction() as tx:
        tx.set_properties({CAPTURE: "false"})
    t.refresh()
    t.upsert(_rows([1, 7], "u"))  # 4 (pre-images from data files from here on)
    t.update("name = 'a'", {"name": "'c'"}, mode="copy-on-write")  # 5
    assert t.compact().version == 6  # 6: maintenance, no change events
    t.iceberg.append(_rows([20, 21], "f").cast(t.arrow_schema))  # 7: another writer (plain pyiceberg), reconciled by readers
    t.refresh()
    t.delete("id = 1")  # 8
    assert t.version == 8


def _stream(spark: Any, t: lineage.Table, warehouse: str, **options: object) -> Any:
    reader = spark.readStream.format(cdf.spark.register_source(spark)).option("table", t.name).option("warehouse", warehouse)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _run(df: Any, checkpoint: str, on_batch: Any = None) -> tuple[list[pa.Table], list[int]]:
    """Run ``df`` with Trigger.AvailableNow into a foreachBatch sink: each batch's rows and end offset."""
    got: list[pa.Table] = []

    def sink(batch: Any, batch_id: int) -> None:
        got.append(batch.toArrow())
        if on_batch is not None:
            on_batch(batch_id)

    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    ends = {p["batchId"]: json.loads(p["sources"][0]["endOffset"])["version"] for p in query.recentProgress}
    return got, [ends[k] for k in sorted(ends)]


def _same(emitted: list[pa.Table], expected: pa.Table) -> None:
    """The batches, concatenated, are ``expected`` row for row (every column, lineage and _changed_columns too) and in order."""
    rows = [r for b in emitted for r in b.select(expected.column_names).to_pylist()]
    assert rows == expected.to_pylist()


def _versions(batch: pa.Table) -> list[int]:
    return sorted(set(batch.column("_commit_version").to_pylist())) if batch.num_rows else []


def test_micro_batches_are_the_per_version_feed_within_limits(spark, warehouse: str, tmp_path) -> None:
    t = lineage.create_table("s.feed", SCHEMA, key=["id"], warehouse=warehouse, properties={CAPTURE: "true"})
    _history(t)
    chk = str(tmp_path / "chk")
    late = lambda batch_id: batch_id == 0 and t.update("id = 2", {"amount": "0"})  # noqa: E731 (version 9, after AvailableNow's target)

    got, ends = _run(_stream(spark, t, warehouse, startingVersion=2, maxVersionsPerTrigger=2), chk, late)
    assert ends == [3, 5, 7, 8]  # two versions a batch, up to the version current when the query started
    assert [_versions(b) for b in got] == [[2, 3], [4, 5], [7], [8]]  # the compaction (6) made no rows; the foreign append did
    _same(got, cdf.changes(t, 1, 8))

    t.upsert(_rows([2, 30], "w"))  # 10
    t.delete("id = 30")  # 11
    more, ends = _run(_stream(spark, t, warehouse, startingVersion=2, maxRowsPerTrigger=1), chk)  # restarted from the checkpoint
    assert ends == [9, 10, 11] and [_versions(b) for b in more] == [[9], [10], [11]]  # a version is never split
    _same(got + more, cdf.changes(t, 1))


def test_starting_points_and_errors(spark, tmp_path) -> None:
    warehouse = str(tmp_path / "wh")
    t = lineage.create_table("s.errs", SCHEMA, key=["id"], warehouse=warehouse, properties={"lineage.cdf.retention.versions": "2"})
    t.append(_rows([1, 2, 3]))  # 1
    t.update("id = 1", {"amount": "amount + 1"})  # 2
    t.delete("id = 2")  # 3

    # latest: the first batch pins the current version and is empty; the next run reads what came after
    chk, latest = str(tmp_path / "latest"), _stream(spark, t, warehouse, startingVersion="latest")
    got, _ = _run(latest, chk)
    assert sum(b.num_rows for b in got) == 0
    t.upsert(_rows([3, 4], "x"))  # 4
    got, _ = _run(latest, chk)
    _same(got, cdf.changes(t, 3))

    # startingTimestamp: from the first version committed at or after it
    v3 = next(c for c in t.history() if c.version == 3)
    got, _ = _run(_stream(spark, t, warehouse, startingTimestamp=v3.timestamp.isoformat()), str(tmp_path / "ts"))
    _same(got, cdf.changes(t, 2))

    # a start before the retention window fails as cdf.changes does, naming the oldest start
    with pytest.raises(RetentionError) as feed_error:
        cdf.changes(t, 1)
    with pytest.raises(Exception) as stream_error:
        _run(_stream(spark, t, warehouse, startingVersion=2), str(tmp_path / "old"))
    assert "RetentionError" in str(stream_error.value) and str(feed_error.value) in str(stream_error.value)
    assert "may start at version 3 at the earliest" in str(stream_error.value)
    with pytest.raises(Exception, match="pass exactly one of startingVersion"):  # options are checked by load()
        _stream(spark, t, warehouse)

    # a schema change stops the running query; a query loaded again reads on with the new columns
    with t.iceberg.update_schema() as u:
        u.add_column("note", StringType())
    t.refresh()
    t.update("id = 3", {"note": "'n'"})  # 5
    with pytest.raises(Exception) as changed:
        _run(latest, chk)  # the DataFrame loaded before the change
    assert "FeedSchemaChangedError" in str(changed.value) and "restart it from its checkpoint" in str(changed.value)
    more, _ = _run(_stream(spark, t, warehouse, startingVersion="latest"), chk)
    _same(more, cdf.changes(t, 4))
    assert more[-1].column("note").to_pylist() == [None, "n"]


def test_options_are_checked() -> None:
    parse = SourceOptions.parse
    base = {"table": "s.t", "warehouse": "wh"}
    opts = parse({**base, "STARTINGVERSION": "12", "maxVersionsPerTrigger": "5", "columns": "id, name", "catalog.uri": "x"})
    assert (opts.starting_version, opts.max_versions, opts.columns, opts.catalog_properties) == (12, 5, ("id", "name"), {"uri": "x"})
    assert parse({"path": "s.t", "catalog": "prod", "startingVersion": "latest"}).starting_latest
    for options, needle in (
        (base, "pass exactly one of startingVersion"),
        ({**base, "startingVersion": "1", "startingTimestamp": "2026-01-01"}, "pass exactly one of startingVersion"),
        ({**base, "startingVersion": "1", "maxRowPerTrigger": "5"}, "unknown option(s) ['maxrowpertrigger']"),
        ({**base, "startingVersion": "soon"}, "option startingVersion must be a whole number >= 0, got 'soon'"),
        ({**base, "startingVersion": "1", "maxRowsPerTrigger": "0"}, "option maxRowsPerTrigger must be a whole number >= 1"),
        ({**base, "startingVersion": "1", "readChangeFeed": "false"}, "readChangeFeed may only be true"),
        ({"warehouse": "wh", "startingVersion": "1"}, "needs the table"),
        ({"table": "s.t", "startingVersion": "1"}, "needs the catalog"),
    ):
        with pytest.raises(InvalidArgumentError, match=re.escape(needle)):
            parse(options)


def test_micro_batch_partitions_name_units_and_tasks_plan_them(spark, warehouse: str, monkeypatch) -> None:
    """The driver's partitions of a micro-batch hold no pointer (it builds none); read one after the other, as a task
    reads them, they are the per-version feed row for row, a version larger than rowsPerPartition cut by row ids."""
    import cdf.engine_duckdb
    import cdf.pointers
    import cdf.stream
    from cdf.spark_source import ChangeFeedSource

    t = lineage.create_table("s.units", SCHEMA, key=["id"], warehouse=warehouse, properties={CAPTURE: "true"})
    _history(t)
    t.append(_rows(list(range(100, 140)), "b"))  # 9: 40 images, cut into ranges of row ids
    t.update("id >= 120", {"amount": "amount + 1"})  # 10
    source = ChangeFeedSource({"table": t.name, "warehouse": warehouse, "startingVersion": "2", "rowsPerPartition": "8"})
    reader = source.streamReader(source.schema())

    def planned_on_driver(*args, **kwargs):
        raise AssertionError("the driver planned the micro-batch's pointers")

    with monkeypatch.context() as m:
        for module in (cdf.pointers, cdf.engine_duckdb, cdf.stream):
            m.setattr(module, "change_pointers", planned_on_driver)
        m.setattr(cdf.pointers.PointerSources, "pointers", planned_on_driver)
        parts = reader.partitions({"version": 1}, {"version": 10})
    units = [p.unit for p in parts]
    # the log's images per version 2-10: 6, 1, 3, 8, 0, 2, 1, 40, 40; consecutive versions together up to 8
    assert [(u.lo, u.hi) for u in units if u.rows is None] == [(1, 3), (3, 4), (4, 6), (6, 8)]
    assert [(u.lo, u.hi) for u in units if u.rows is not None] == [(8, 9)] * 5 + [(9, 10)] * 5  # 40 images: 5 row-id ranges
    assert all(not hasattr(p, "part") for p in parts)
    _same([pa.Table.from_batches([b for p in parts for b in reader.read(p)])], cdf.changes(t, 1, 10))


def _emitted(out: str) -> tuple[list[pa.Table], dict[int, list[pa.Table]]]:
    """The sink's batches in batch order, and the replays of each replayed batch."""
    first: dict[int, pa.Table] = {}
    replays: dict[int, list[pa.Table]] = {}
    for path in sorted(glob.glob(os.path.join(out, "batch-*.parquet"))):
        m = re.fullmatch(r"batch-(\d+)(\.replay-\d+)?\.parquet", os.path.basename(path))
        assert m, path
        if m.group(2):
            replays.setdefault(int(m.group(1)), []).append(pq.read_table(path))
        else:
            first[int(m.group(1))] = pq.read_table(path)
    assert sorted(first) == list(range(len(first))), sorted(first)
    return [first[i] for i in sorted(first)], replays


def _wait_for_batch(out: str, past: int, job: Any, timeout: float = 600) -> None:
    """Wait until the sink wrote more than ``past`` batches (or the job ended).

    The timeout only catches a hung job: on a loaded machine a child's JVM alone can take minutes to start.
    """
    deadline = time.time() + timeout
    while len(glob.glob(os.path.join(out, "batch-*.parquet"))) <= past and job.poll() is None:
        assert time.time() < deadline, "the streaming job wrote no batch"
        time.sleep(0.05)


def test_kills_and_restarts_emit_every_change_once(spark, warehouse: str, tmp_path) -> None:
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    t = lineage.create_table("s.killed", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_rows(list(range(1, 41)), "a"))  # 1
    t.update("id % 3 = 0", {"amount": "amount + 1"})  # 2
    out, chk, err = str(tmp_path / "out"), str(tmp_path / "chk"), str(tmp_path / "job.stderr")
    os.makedirs(out)
    args = (warehouse, t.name, "2", chk, out)

    def writer() -> None:  # a commit every 0.2-0.6 s while the query runs and is killed
        w = lineage.open_table(t.name, warehouse=warehouse)
        for i in range(30):
            k = rnd.randrange(1, 60)
            [lambda: w.upsert(_rows([k, k + 60], "u", float(i))), lambda: w.delete(f"id % 7 = {i % 7}"),
             lambda: w.update(f"id % 5 = {i % 5}", {"amount": "amount * 2"}), lambda: w.compact()][i % 4]()
            time.sleep(rnd.uniform(0.2, 0.6))

    thread = threading.Thread(target=writer)
    job = start_job("feed_stream_job.py", *args, "run", "1", stderr_path=err)  # kills itself once its sink wrote batch 1
    try:
        _wait_for_batch(out, 0, job)
        thread.start()  # commits land while the query runs
        assert finish_job(job, err, timeout=300) < 0
        job = start_job("feed_stream_job.py", *args, "run", stderr_path=err)  # replays batch 1, then is killed at random
        _wait_for_batch(out, len(glob.glob(os.path.join(out, "batch-*.parquet"))), job)
        time.sleep(rnd.uniform(0, 2))
        kill_job(job)
    finally:
        kill_job(job)
        if thread.ident is not None:
            thread.join()
    # the rest with Trigger.AvailableNow, in this process: the same source and sink
    drain = _stream(spark, t, warehouse, startingVersion=2, maxVersionsPerTrigger=MAX_VERSIONS)
    drain.writeStream.foreachBatch(lambda df, i: write_batch(out, df, i)).option("checkpointLocation", chk) \
        .trigger(availableNow=True).start().awaitTermination()

    emitted, replays = _emitted(out)
    assert 1 in replays, f"seed {seed}: batch 1 was not replayed"
    for i, again in replays.items():  # a replayed batch is the same rows
        assert all(r.equals(emitted[i]) for r in again), f"seed {seed}: batch {i} replayed differently"
    firsts = [min(_versions(b), default=None) for b in emitted]
    lasts = [max(_versions(b), default=None) for b in emitted]
    seen = [v for v in lasts if v is not None]
    assert seen == sorted(seen), f"seed {seed}: batches out of version order"
    assert all(f is None or p is None or f > p for f, p in zip(firsts[1:], lasts[:-1], strict=True)), f"seed {seed}"
    t.refresh()
    assert len(emitted) >= 6 and t.version > 20
    _same(emitted, cdf.changes(t, 1))
