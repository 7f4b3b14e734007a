"""Exactly once for every change stream, after the commit log and the snapshots are expired.

A stream tags each commit with its id and batch id; a batch at or below the
stream's last committed one is a replay (what Spark does after a crash
between our commit and its checkpoint) and must commit nothing. The property
test runs several streams on one table, with both write strategies, and
draws at random: new batches, replays of any earlier batch, ``maintain()``
(which expires the commit log beyond a short retention), snapshot expiry,
and another engine's appends and snapshot expiry (pyiceberg, which records
nothing of ours). After every step:

* a new batch is applied once, a replay changes nothing; or the write raises
  StreamPositionLostError, and only where the position was really lost
  (another engine expired snapshots this library had not recorded), after
  which the operator's ``reset_stream_position`` lets the stream go on;
* the table holds exactly the model's rows.

The Spark test replays a batch through ``ChangelogSink`` with a real
streaming query, after another stream's commits and ``maintain()`` expired
the first stream's entries from the log.
"""

from __future__ import annotations

import os
import shutil

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import lineage
from lineage.errors import StreamPositionLostError

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.int64())])
STREAMS = ("A", "B", "C")


def _event(key: int, value: int) -> pa.Table:
    return pa.table({"id": pa.array([key], pa.int64()), "v": pa.array([value], pa.int64()), "_op": ["+I"]})


def _key(stream: int, batch: int) -> int:
    return stream * 100_000 + batch


ops = st.one_of(
    st.tuples(st.just("batch"), st.integers(0, 2)),
    st.tuples(st.just("batch"), st.integers(0, 2)),
    st.tuples(st.just("batch"), st.integers(0, 2)),
    st.tuples(st.just("replay"), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("maintain")),
    st.tuples(st.just("expire")),
    st.tuples(st.just("foreign-append")),
    st.tuples(st.just("foreign-expire")),
)


class Run:
    """The table under test and the model: rows by key and each stream's last applied batch."""

    def __init__(self, t: lineage.Table) -> None:
        self.t = t
        self.rows: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.value = 0
        self.foreign = 0
        self.lost_possible = False  # another engine expired snapshots this library may not have recorded

    def write(self, stream: int, batch: int) -> lineage.CommitInfo:
        """Apply batch ``batch`` of ``stream``; on a lost position, record the model's and write again."""
        self.value += 1
        data = _event(_key(stream, batch), self.value)
        try:
            return self.t.apply_changelog(data, upsert=True, stream=(STREAMS[stream], batch))
        except StreamPositionLostError as exc:
            assert self.lost_possible, f"position reported lost with no foreign expiry: {exc}"
            assert "reset_stream_position" in str(exc)
            self.t.refresh()
            assert self.t.scan(columns=["id", "v"]).num_rows == len(self.rows)  # nothing was applied
            # The operator's word, from the model: the stream's last applied batch, or None when it applied nothing yet.
            self.t.reset_stream_position(STREAMS[stream], self.last.get(stream))
            return self.t.apply_changelog(data, upsert=True, stream=(STREAMS[stream], batch))

    def step(self, op: tuple) -> None:
        kind = op[0]
        if kind == "batch":
            stream = op[1]
            batch = self.last.get(stream, -1) + 1
            info = self.write(stream, batch)
            assert info.committed, f"new batch {batch} of stream {STREAMS[stream]} was not applied"
            self.last[stream] = batch
            self.rows[_key(stream, batch)] = self.value
        elif kind == "replay":
            stream, back = op[1], op[2]
            if stream not in self.last:
                return
            batch = max(0, self.last[stream] - back)
            version = self.t.refresh().version
            info = self.write(stream, batch)
            assert not info.committed, f"replayed batch {batch} of stream {STREAMS[stream]} was applied again"
            assert self.t.refresh().version == version
        elif kind == "maintain":
            self.t.maintain()
        elif kind == "expire":
            self.t.expire_snapshots(retain_last=1)
        elif kind == "foreign-append":
            self.foreign += 1
            key = 900_000 + self.foreign
            self.t.refresh().iceberg.append(pa.table({"id": pa.array([key], pa.int64()), "v": pa.array([-1], pa.int64())}, schema=SCHEMA))
            self.rows[key] = -1
        elif kind == "foreign-expire":
            ice = self.t.refresh().iceberg
            head = ice.metadata.current_snapshot()
            old = [s.snapshot_id for s in ice.metadata.snapshots if head is None or s.snapshot_id != head.snapshot_id]
            if old:
                ice.maintenance.expire_snapshots().by_ids(old).commit()
                self.lost_possible = True
        self.t.refresh()

    def check(self) -> None:
        got = {r["id"]: r["v"] for r in self.t.scan(columns=["id", "v"]).to_pylist()}
        assert got == self.rows


@pytest.mark.parametrize("strategy", ["position", "equality"])
@settings(
    max_examples=int(os.environ.get("LINEAGE_PROPERTY_EXAMPLES", "12")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(ops, min_size=4, max_size=28))
def test_every_stream_applies_each_batch_once(tmp_path_factory, strategy: str, steps: list[tuple]) -> None:
    warehouse = str(tmp_path_factory.mktemp("wh"))
    properties = {"lineage.cdf.retention.versions": "2", "write.changelog.strategy": strategy}
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse, properties=properties)
    run = Run(t)
    for i, op in enumerate(steps):
        note(f"step {i}: {op}")
        run.step(op)
    run.check()
    shutil.rmtree(warehouse, ignore_errors=True)


@pytest.mark.parametrize("strategy", ["position", "equality"])
def test_many_streams_survive_log_expiry(warehouse: str, strategy: str) -> None:
    """The measured case: stream A commits 3 batches, stream B 120 with maintain() every 16; A replays its batch 2."""
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse,
                             properties={"lineage.cdf.retention.versions": "3", "write.changelog.strategy": strategy})
    for b in range(3):
        t.apply_changelog(_event(_key(0, b), b), upsert=True, stream=("A", b))
    for b in range(120):
        t.apply_changelog(_event(_key(1, b % 7), b), upsert=True, stream=("B", b))
        if b % 16 == 15:
            t.maintain()
    version = t.version
    assert not t.apply_changelog(_event(_key(0, 2), 99), upsert=True, stream=("A", 2)).committed
    assert not t.apply_changelog(_event(_key(1, 119), 99), upsert=True, stream=("B", 119)).committed
    assert t.refresh().version == version
    assert t.scan(f"id = {_key(0, 2)}", columns=["v"]).to_pylist() == [{"v": 2}]
    assert t.apply_changelog(_event(_key(0, 3), 3), upsert=True, stream=("A", 3)).committed


def test_lost_position_is_refused_until_recorded(warehouse: str) -> None:
    """Another engine appends and expires everything below its commit: the equality strategy cannot tell any more."""
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse, properties={"write.changelog.strategy": "equality"})
    for b in range(3):
        t.apply_changelog(_event(_key(0, b), b), upsert=True, stream=("A", b))
    ice = t.iceberg
    ice.append(pa.table({"id": pa.array([900_001], pa.int64()), "v": pa.array([-1], pa.int64())}, schema=SCHEMA))
    head = ice.metadata.current_snapshot().snapshot_id
    ice.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in ice.metadata.snapshots if s.snapshot_id != head]).commit()
    t.refresh()
    version = t.version
    with pytest.raises(StreamPositionLostError, match=r"'A'.*reset_stream_position"):
        t.apply_changelog(_event(_key(0, 2), 99), upsert=True, stream=("A", 2))
    assert t.refresh().version == version
    t.reset_stream_position("A", 2)
    assert not t.apply_changelog(_event(_key(0, 2), 99), upsert=True, stream=("A", 2)).committed
    assert t.apply_changelog(_event(_key(0, 3), 3), upsert=True, stream=("A", 3)).committed
    assert t.scan(f"id = {_key(0, 2)}", columns=["v"]).to_pylist() == [{"v": 2}]


@pytest.mark.spark
@pytest.mark.parametrize("strategy", ["position", "equality"])
def test_changelog_sink_skips_a_replay_after_other_streams_expired_its_entries(spark, tmp_path, strategy: str) -> None:
    """A real streaming query (stream A) commits 3 batches; stream B commits 40 with maintain() every 8, so A's
    entries leave the commit log; A's checkpoint then loses its last commit (a crash between our commit and
    Spark's) and the restarted query replays batch 2: the sink skips it."""
    import pyarrow.parquet as pq

    from lineage import streaming

    warehouse = str(tmp_path / "wh")
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse,
                             properties={"lineage.cdf.retention.versions": "2", "write.changelog.strategy": strategy})
    input_dir, checkpoint = tmp_path / "in", tmp_path / "chk"
    input_dir.mkdir()
    for b in range(3):
        batch = _event(_key(0, b), b).append_column("seq", pa.array([b], pa.int64()))
        pq.write_table(batch, input_dir / f"batch-{b}.parquet")
        os.utime(input_dir / f"batch-{b}.parquet", (1_000_000 + b, 1_000_000 + b))
    stages: list[str] = []

    def run_query() -> None:
        sink = streaming.ChangelogSink("s.t", warehouse=warehouse, stream_id="A", order_by="seq", upsert=True)
        query = (
            spark.readStream.schema("id BIGINT, v BIGINT, _op STRING, seq BIGINT").option("maxFilesPerTrigger", 1).parquet(str(input_dir))
            .writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        )
        query.awaitTermination()

    streaming._FAULT_HOOK = lambda stage, batch_id: stages.append(f"{stage} {batch_id}")
    try:
        run_query()
        assert stages == ["committed 0", "committed 1", "committed 2"]
        for b in range(40):
            t.apply_changelog(_event(_key(1, b % 5), b), upsert=True, stream=("B", b))
            if b % 8 == 7:
                t.maintain()
        t.refresh()
        assert not any(c.properties.get("lineage.user.stream-id") == "A" for c in t.history() if c.version > 3)
        version = t.version
        for name in ("2", ".2.crc"):  # Spark never recorded batch 2 as done: it runs it again
            (checkpoint / "commits" / name).unlink(missing_ok=True)
        stages.clear()
        run_query()
    finally:
        streaming._FAULT_HOOK = None
    assert stages == ["skipped 2"], stages
    assert t.refresh().version == version
    assert t.scan(f"id = {_key(0, 2)}", columns=["v"]).to_pylist() == [{"v": 2}]
