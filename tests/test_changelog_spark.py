"""Change streams from Spark: ``apply_changelog`` of Spark DataFrames, and the exactly-once streaming sink.

The streaming test runs a real Structured Streaming query in a child process
(``changelog_stream_job.py``), kills it with SIGKILL right after a batch
committed to the table and before Spark recorded the batch in its
checkpoint, restarts it from the checkpoint (in the test's own Spark
session: only the kill needs a process of its own), and checks that the
replayed batch was skipped and every batch was applied exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from changelog_stream_job import run as run_stream
from conftest import SCHEMA, finish_job, rows, start_job

import cdf
import lineage
from index.key_index import KeyIndex
from lineage.maintenance.key_index import check_key_index
from index.deleted_rows import read_index

pytestmark = pytest.mark.spark

BASE = pa.table({"id": range(1, 7), "name": ["v0"] * 6, "amount": [float(i) for i in range(1, 7)]}, schema=SCHEMA)

# Three batches, valid in strict mode only when each applies once and in order (-U images name the previous batch's values).
BATCHES = [
    [("-U", 1, "v0", 1.0), ("+U", 1, "v1", 10.0), ("-D", 2, "v0", 2.0), ("+I", 7, "n", 7.0),
     ("+I", 9, "n", 9.0), ("-U", 9, "n", 9.0), ("+U", 9, "v1", 9.5)],
    [("-U", 1, "v1", 10.0), ("+U", 1, "v2", 11.0), ("+I", 8, "n", 8.0), ("-D", 7, "n", 7.0)],
    [("-U", 3, "v0", 3.0), ("+U", 3, "v1", 30.0), ("-D", 8, "n", 8.0), ("+I", 2, "back", 2.5)],
]


def _batch(events: list[tuple], first_seq: int, shuffle: bool = True) -> pa.Table:
    """Events with a global ``seq``; rows shuffled, so only ``seq`` orders them."""
    rows_ = [(*e, first_seq + i) for i, e in enumerate(events)]
    if shuffle:
        random.Random(first_seq).shuffle(rows_)
    cols = list(zip(*rows_, strict=True))
    return pa.table(
        {"_op": pa.array(cols[0]), "id": pa.array(cols[1], pa.int64()), "name": pa.array(cols[2]), "amount": pa.array(cols[3], pa.float64()),
         "seq": pa.array(cols[4], pa.int64())}
    )


def _reference(warehouse: str, n: int) -> lineage.Table:
    """The first ``n`` batches applied once each through the embedded (DuckDB) path."""
    ref = lineage.create_table("s.ref", SCHEMA, key=["id"], warehouse=warehouse)
    ref.append(BASE)
    seq = 0
    for events in BATCHES[:n]:
        ref.apply_changelog(_batch(events, seq), order_by="seq")
        seq += len(events)
    return ref


def _feed(t: lineage.Table) -> list[tuple]:
    f = cdf.changes(t, 1).to_pylist()
    return sorted((r["_commit_version"], r["_change_type"], r["id"], r["name"], r["amount"]) for r in f)


LINEAGE = ["id", "name", "amount", "_row_created_at_version", "_row_last_updated_at_version"]


def test_spark_dataframe_matches_the_embedded_path(spark, warehouse: str, monkeypatch) -> None:
    ref = _reference(warehouse, 2)
    t = lineage.create_table("s.sp", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(BASE)
    seq = 0
    with monkeypatch.context() as m:
        m.setattr(KeyIndex, "build", lambda state: pytest.fail("the key index was rebuilt: a Spark changelog commit dropped it"))
        for events in BATCHES[:2]:
            df = spark.createDataFrame(_batch(events, seq).to_pandas())
            info = t.apply_changelog(df, order_by="seq")
            assert info.committed
            seq += len(events)
    assert rows(t.scan(columns=LINEAGE)) == rows(ref.scan(columns=LINEAGE))
    kept = "id IN (1, 3, 4, 5, 6)"  # rows live since the base load keep their row ids on both paths
    assert rows(t.scan(kept, columns=["id", "_row_id"])) == rows(ref.scan(kept, columns=["id", "_row_id"]))
    assert _feed(t) == _feed(ref)

    replay = spark.createDataFrame(_batch(BATCHES[0], 0).to_pandas())
    with pytest.raises(lineage.KeyViolationError, match="nothing was written"):
        t.apply_changelog(replay, order_by="seq")  # -U 1 names an image that is no longer live, -D 2 an absent key, ...
    info = t.apply_changelog(replay, order_by="seq", upsert=True)
    assert (info.updated, info.inserted, info.ignored) == (2, 1, 1)  # keys 1 and 9 update, +I 7 inserts, -D 2 (absent) is ignored
    assert t.state().lineage.key_index  # strict (images read from the hit files) and upsert batches (index only) kept it
    problems, _ = check_key_index(t.state())
    assert not problems, problems
    with pytest.raises(lineage.InvalidArgumentError, match="order_by"):
        t.apply_changelog(replay)
    bad = spark.createDataFrame(_batch([("+X", 50, "n", 1.0)], 0).to_pandas())
    with pytest.raises(lineage.InvalidArgumentError, match="'\\+X'"):
        t.apply_changelog(bad, order_by="seq")
    tie = spark.createDataFrame(_batch([("-U", 4, "v0", 4.0), ("+U", 4, "x", 1.0)], 0).to_pandas().assign(seq=3))
    with pytest.raises(lineage.InvalidArgumentError, match="order is ambiguous|strict order"):
        t.apply_changelog(tie, order_by="seq")


def test_spark_changelog_captures_pre_images(spark, warehouse: str) -> None:
    """With pre-image capture, a Spark change-stream commit stores its removed images' values (read back by position)."""
    ref = _reference(warehouse, 1)
    t = lineage.create_table("s.spcap", SCHEMA, key=["id"], warehouse=warehouse, properties={"lineage.cdf.capture-preimages": "true"})
    t.append(BASE)
    assert t.apply_changelog(spark.createDataFrame(_batch(BATCHES[0], 0).to_pandas()), order_by="seq").committed
    segment = read_index(t.iceberg.io, t.state().lineage.commits[-1].index, with_values=True)
    fid = {f.name: str(f.field_id) for f in t.iceberg.schema().fields}
    assert segment.captured  # -U 1 and -D 2 removed the base images (1, v0, 1.0) and (2, v0, 2.0)
    got = sorted(zip(*(segment.values.column(fid[c]).to_pylist() for c in ("id", "name", "amount")), strict=True))
    assert got == [(1, "v0", 1.0), (2, "v0", 2.0)]
    assert _feed(t) == _feed(ref)


def test_streaming_sink_survives_a_kill_between_commit_and_checkpoint(spark, tmp_path, warehouse: str) -> None:
    input_dir, checkpoint, log = str(tmp_path / "in"), str(tmp_path / "chk"), str(tmp_path / "sink.log")
    os.makedirs(input_dir)
    seq, now = 0, time.time()
    for i, events in enumerate(BATCHES):  # the file source takes files oldest first
        path = os.path.join(input_dir, f"batch-{i}.parquet")
        pq.write_table(_batch(events, seq), path)
        os.utime(path, (now - 100 + i, now - 100 + i))
        seq += len(events)
    t = lineage.create_table("s.stream", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(BASE)

    err = log + ".stderr"
    job = start_job("changelog_stream_job.py", warehouse, "s.stream", input_dir, checkpoint, log, "1", stderr_path=err)
    assert finish_job(job, err) == -signal.SIGKILL
    with open(log) as f:
        assert f.read().split("\n")[:-1] == ["committed 0", "committed 1"]
    t.refresh()
    assert [c.properties["lineage.user.stream-batch-id"] for c in t.history() if c.operation == "changelog"] == ["0", "1"]

    run_stream(spark, warehouse, "s.stream", input_dir, checkpoint, log)  # the restart
    with open(log) as f:
        lines = f.read().split("\n")[:-1]
    assert lines[2:4] == ["skipped 1", "committed 2"], lines  # Spark replayed batch 1: a no-op
    query_id = lines[4].split()[1]

    t.refresh()
    tagged = [c.properties for c in t.history() if c.operation == "changelog"]
    assert [p["lineage.user.stream-batch-id"] for p in tagged] == ["0", "1", "2"]  # each batch exactly once
    assert {p["lineage.user.stream-id"] for p in tagged} == {f"spark-query-{query_id}"}  # the query id survives the restart
    ref = _reference(str(tmp_path / "ref"), 3)
    assert rows(t.scan(columns=LINEAGE)) == rows(ref.scan(columns=LINEAGE))
    assert _feed(t) == _feed(ref)
    assert t.state().lineage.key_index and not check_key_index(t.state())[0]  # the sink's commits kept the key index
