"""Deletes, updates, compaction and purge on Spark executors: the same rows, row ids, lineage and feed as embedded.

A model-based test runs one random sequence of deletes, updates, compactions and purges on two tables built alike, one written
by the embedded engine and one by Spark, and compares them after every step; the embedded engine is in turn
checked against its own model by tests/test_writes_property.py.
"""

from __future__ import annotations

import datetime
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cdf
import lineage
from conftest import rows

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()), ("ts", pa.timestamp("us")), ("flag", pa.bool_())])

WHERES = [
    "id % 3 = 0",
    "amount > 2.5",
    "amount IS NULL OR amount < 1",
    "name LIKE 'a%'",
    "name ILIKE '%B%' AND id < 20",
    "ts >= TIMESTAMP '2024-01-05'",
    "NOT flag",
    "_row_last_updated_at_version = 1",
    "id IN (1, 2, 3, 30)",
    "amount = CAST('nan' AS DOUBLE)",
    "FALSE",
]
SETS = [
    {"amount": "amount * 2"},
    {"name": "upper(name)", "flag": "NOT flag"},
    {"amount": "NULL"},
    {"ts": "ts + INTERVAL 1 DAY", "amount": "1"},
    {"name": "name || '!'"},
]


def _batch(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n)
    amounts = [float("nan") if i % 11 == 0 else (None if i % 7 == 0 else i * 0.5) for i in ids]
    return pa.table(
        {
            "id": ids,
            "name": [["ann", "Bob", "abe", None, "bea"][i % 5] for i in ids],
            "amount": pa.array(amounts, pa.float64()),
            "ts": pa.array([datetime.datetime(2024, 1, 1) + datetime.timedelta(days=int(i), hours=int(i) % 5) for i in ids], pa.timestamp("us")),
            "flag": [bool(i % 2) for i in ids],
        },
        schema=SCHEMA,
    )


def _rows(table: pa.Table) -> list[tuple]:
    """Sorted rows with NaN spelled out (NaN equals nothing, so two tables' NaN rows would never compare equal)."""
    # Commit timestamps (the only time-zone-aware columns) differ: the two tables commit at different instants.
    table = table.drop_columns([f.name for f in table.schema if pa.types.is_timestamp(f.type) and f.type.tz])
    return sorted((tuple("NaN" if isinstance(v, float) and v != v else v for v in r) for r in rows(table)), key=repr)


def _same(embedded: lineage.Table, on_spark: lineage.Table) -> None:
    assert embedded.version == on_spark.version
    assert _rows(on_spark.scan()) == _rows(embedded.scan())


@settings(max_examples=int(os.environ.get("LINEAGE_PROPERTY_EXAMPLES", "4")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_spark_writes_and_maintenance_match_the_embedded_engine(spark, tmp_path_factory, data) -> None:
    warehouse = str(tmp_path_factory.mktemp("wh"))
    capture = data.draw(st.booleans(), label="capture")
    props = {"lineage.cdf.capture-preimages": "true"} if capture else {}
    partition = data.draw(st.sampled_from([None, ["bucket(2, id)"]]), label="partition_by")
    tables = [lineage.create_table(f"s.{n}", SCHEMA, key=["id"], partition_by=partition, warehouse=warehouse, properties=props)
              for n in ("embedded", "spark")]
    for t in tables:
        t.append(_batch(0, 20))
        t.append(_batch(20, 15))
    embedded, on_spark = tables
    for _ in range(data.draw(st.integers(2, 4), label="steps")):
        where = data.draw(st.sampled_from(WHERES), label="where")
        kind = data.draw(st.sampled_from(["delete", "update", "compact", "purge"]), label="operation")
        if kind == "compact":
            feed = _rows(cdf.changes(on_spark, 0))
            a, b = embedded.compact(), on_spark.compact(engine="spark", spark=spark)
            assert (a.version, a.files_added, a.files_removed) == (b.version, b.files_added, b.files_removed)
            assert _rows(cdf.changes(on_spark, 0)) == feed  # compaction makes no change events
        elif kind == "purge":
            a, b = embedded.purge(where), on_spark.purge(where, engine="spark", spark=spark)
            assert (a.version, a.files_removed) == (b.version, b.files_removed)
        elif kind == "delete":
            a = embedded.delete(where)
            b = on_spark.delete(where, engine="spark", spark=spark)
            assert (a.committed, a.deleted) == (b.committed, b.deleted)
        else:
            set_ = data.draw(st.sampled_from(SETS), label="set")
            a = embedded.update(where, set_)
            b = on_spark.update(where, set_, engine="spark", spark=spark)
            assert (a.committed, a.updated) == (b.committed, b.updated)
        _same(embedded, on_spark)
    for net in (False, True):
        assert _rows(cdf.changes(on_spark, 0, net=net)) == _rows(cdf.changes(embedded, 0, net=net))
    assert _rows(cdf.deleted_rows(on_spark)) == _rows(cdf.deleted_rows(embedded))


def test_spark_rewrites_refuse_what_they_cannot_do(spark, warehouse) -> None:
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch(0, 5))
    with pytest.raises(lineage.InvalidArgumentError, match="merge-on-read"):
        t.delete("id = 1", mode="copy-on-write", engine="spark", spark=spark)
    with pytest.raises(lineage.InvalidArgumentError, match="key column"):
        t.update("id = 1", {"id": "id + 100"}, engine="spark", spark=spark)
    with pytest.raises(lineage.InvalidArgumentError, match="engine"):
        t.delete("id = 1", engine="polars")
    with pytest.raises(lineage.UnknownColumnError):
        t.update("nope = 1", {"amount": "1"}, engine="spark", spark=spark)
    assert t.version == 1 and t.count() == 5  # nothing was committed


def _delete_files(t: lineage.Table) -> list[list[int]]:
    """Per live data file (by row count), the row counts of the delete files that apply to it."""
    tasks = t.iceberg.refresh().scan().plan_files()
    return sorted([task.file.record_count, *sorted(d.record_count for d in task.delete_files)] for task in tasks)


@pytest.mark.parametrize("merge", ["true", "false"])
def test_spark_deletes_merge_a_files_earlier_delete_file_as_embedded(spark, warehouse, merge) -> None:
    # On v2 a data file keeps one delete file of ours: a later delete writes the union and replaces the earlier file, on
    # Spark as embedded (a compaction then removes as many files on both, and readers open one delete file per data file).
    props = {"lineage.write.delete.merge": merge}
    tables = [lineage.create_table(f"s.{n}", SCHEMA, key=["id"], warehouse=warehouse, properties=props) for n in ("e", "s")]
    for t in tables:
        t.append(_batch(0, 20))
        t.append(_batch(20, 15))
    embedded, on_spark = tables
    for where in ("id % 3 = 0", "amount > 2.5"):
        embedded.delete(where)
        on_spark.delete(where, engine="spark", spark=spark)
    layout = _delete_files(on_spark)
    assert layout == _delete_files(embedded)
    assert [len(f) for f in layout] == ([2, 2] if merge == "true" else [3, 3])
    _same(embedded, on_spark)


def test_a_spark_delete_matching_nothing_commits_nothing(spark, warehouse) -> None:
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch(0, 5))
    info = t.delete("id > 100", engine="spark", spark=spark)
    assert not info.committed and t.version == 1


def _collected_rows(monkeypatch, spark) -> list[int]:
    """Count the rows every ``collect``/``toArrow`` (of a DataFrame or an RDD) hands the driver (what crosses from the executors)."""
    cls = type(spark.range(1))
    counts: list[int] = []
    collect, to_arrow = cls.collect, cls.toArrow

    def counted_collect(self):  # type: ignore[no-untyped-def]
        got = collect(self)
        counts.append(len(got))
        return got

    def counted_to_arrow(self):  # type: ignore[no-untyped-def]
        got = to_arrow(self)
        counts.append(got.num_rows)
        return got

    from pyspark import RDD

    rdd_collect = RDD.collect  # a PipelinedRDD inherits it

    def counted_rdd_collect(self):  # type: ignore[no-untyped-def]
        got = rdd_collect(self)
        counts.append(len(got))
        return got

    monkeypatch.setattr(cls, "collect", counted_collect)
    monkeypatch.setattr(cls, "toArrow", counted_to_arrow)
    monkeypatch.setattr(RDD, "collect", counted_rdd_collect)
    return counts


@pytest.mark.parametrize("capture", [False, True])
def test_what_reaches_the_driver_does_not_grow_with_the_matched_rows(spark, warehouse, monkeypatch, capture) -> None:
    props = {"lineage.cdf.capture-preimages": "true"} if capture else {}
    crossed = {}
    for where, matched in (("id % 400 = 0", 4), ("id % 2 = 0", 800)):
        t = lineage.create_table(f"s.t{matched}", SCHEMA, key=["id"], warehouse=warehouse, properties=props)
        for start in range(0, 1600, 400):
            t.append(_batch(start, 400))  # four data files
        counts = _collected_rows(monkeypatch, spark)
        assert t.delete(where, engine="spark", spark=spark).deleted == matched
        counts_delete = sum(counts)
        counts.clear()
        assert t.update("id % 3 = 0", {"amount": "amount + 1"}, engine="spark", spark=spark).updated > 100
        crossed[matched] = (counts_delete, sum(counts))
        monkeypatch.undo()
        assert t.count() == 1600 - matched
    # one summary row per data file touched (4) and one for the index segment, whatever the delete matched
    assert 0 < crossed[4][0] == crossed[800][0] <= 4 + 1
    assert 0 < crossed[4][1] == crossed[800][1] <= 4 + 1 + 1  # and one descriptor per written data file


def _without_new_row_ids(table: pa.Table, version: int) -> list[tuple]:
    """Sorted rows, the row ids of rows inserted at ``version`` left out (engines number fresh rows in their own file order)."""
    rows_ = table.drop_columns([f.name for f in table.schema if pa.types.is_timestamp(f.type) and f.type.tz]).to_pylist()
    return sorted((tuple(None if k == "_row_id" and r["_row_created_at_version"] == version else ("NaN" if v != v else v)
                         for k, v in r.items()) for r in rows_), key=repr)


@pytest.mark.parametrize("strategy", ["lookup", "join", "auto"])
def test_spark_upserts_by_key_index_lookup_or_join_match_the_embedded_engine(spark, warehouse, strategy) -> None:
    from lineage.writes import spark as spark_writes

    tables = [lineage.create_table(f"s.{n}", SCHEMA, key=["id"], partition_by=["bucket(2, id)"], warehouse=warehouse,
                                   properties={"lineage.cdf.capture-preimages": "true"}) for n in ("embedded", "spark")]
    for t in tables:
        t.append(_batch(0, 40))
        t.delete("id % 4 = 0")
    embedded, on_spark = tables
    batch = _batch(35, 10)  # 4 live keys, 1 deleted one (36), 5 new ones
    a = embedded.upsert(batch, mode="merge-on-read")
    b = spark_writes.upsert(on_spark._context, spark.createDataFrame(batch), "merge-on-read", strategy)
    assert (a.version, a.updated, a.inserted) == (b.version, b.updated, b.inserted) == (3, 4, 6)
    assert _without_new_row_ids(on_spark.scan(), b.version) == _without_new_row_ids(embedded.scan(), a.version)
    for net in (False, True):
        assert _without_new_row_ids(cdf.changes(on_spark, 0, net=net), b.version) == _without_new_row_ids(cdf.changes(embedded, 0, net=net), a.version)
    from lineage.maintenance import verify

    assert verify(on_spark).ok


@pytest.mark.parametrize("strategy", ["lookup", "join"])
def test_spark_writes_build_the_key_index_delta_in_bounded_memory_as_embedded(spark, warehouse, monkeypatch, strategy) -> None:
    # Spark's delete, update and upsert name their tombstones (a delete's removed keys; none for an update or an upsert),
    # so a large delta is built by index.key_delta's bounded build (every delta that names them, with SPOOL_ROWS=0):
    # the same live entries as the embedded engine's, and an index that verify() finds equal to the live rows.
    from index import key_delta
    from index.key_index import KeyIndex
    from lineage.maintenance import verify
    from lineage.writes import spark as spark_writes

    spooled = []
    real = key_delta.spooled_delta
    monkeypatch.setattr(key_delta, "SPOOL_ROWS", 0)
    monkeypatch.setattr(key_delta, "spooled_delta", lambda *a, **k: spooled.append(1) or real(*a, **k))
    tables = [lineage.create_table(f"s.{n}", SCHEMA, key=["id"], warehouse=warehouse) for n in ("embedded", "spark")]
    for t in tables:
        t.append(_batch(0, 30))
        t.append(_batch(30, 30))
    embedded, on_spark = tables

    def on_spark_spooled(write) -> int:
        before = len(spooled)
        write()
        return len(spooled) - before

    embedded.delete("id % 4 = 0")
    assert on_spark_spooled(lambda: on_spark.delete("id % 4 = 0", engine="spark", spark=spark)) == 1
    embedded.update("id % 3 = 0", {"amount": "amount + 1"})
    assert on_spark_spooled(lambda: on_spark.update("id % 3 = 0", {"amount": "amount + 1"}, engine="spark", spark=spark)) == 1
    batch = _batch(50, 20)  # 8 live keys, 2 deleted ones, 10 new ones
    a = embedded.upsert(batch, mode="merge-on-read")
    got = []
    assert on_spark_spooled(lambda: got.append(spark_writes.upsert(on_spark._context, spark.createDataFrame(batch), "merge-on-read", strategy))) == 1
    b = got[0]
    assert (a.updated, a.inserted) == (b.updated, b.inserted) == (8, 12)

    def entries(t: lineage.Table) -> list[dict]:
        live = KeyIndex.open(t.state()).live_entries()
        return live.select(["id", "_row_created_at_version", "_row_last_updated_at_version"]).sort_by("id").to_pylist()

    assert entries(on_spark) == entries(embedded)
    assert _without_new_row_ids(on_spark.scan(), b.version) == _without_new_row_ids(embedded.scan(), a.version)
    assert verify(on_spark).ok, verify(on_spark).problems


def test_the_upsert_strategy_follows_the_documented_threshold() -> None:
    from lineage.writes.spark_upsert import LOOKUP_MAX_ROWS, choose_strategy

    assert choose_strategy("auto", True, 1_000) == "lookup"
    assert choose_strategy("auto", True, LOOKUP_MAX_ROWS) == "lookup"  # whatever its share of the table
    assert choose_strategy("auto", True, LOOKUP_MAX_ROWS + 1) == "join"
    assert choose_strategy("auto", False, 1) == "join"  # no key index: nothing to look up
    assert choose_strategy("join", True, 1) == "join"
    with pytest.raises(lineage.InvalidArgumentError, match="key index"):
        choose_strategy("lookup", False, 1)
    with pytest.raises(lineage.InvalidArgumentError, match="strategy"):
        choose_strategy("hash", True, 1)


def test_every_spark_path_takes_the_active_session_and_says_so_without_one(spark, warehouse, monkeypatch) -> None:
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch(0, 5))
    assert t.delete("id = 1", engine="spark").deleted == 1  # spark= omitted: the active session
    assert cdf.changes(t, 0, engine="spark").count() == 6  # five inserts, one delete
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    for call in (lambda: t.delete("id = 2", engine="spark"), lambda: t.update("id = 2", {"amount": "1"}, engine="spark"),
                 lambda: t.compact(engine="spark"), lambda: t.purge("id = 2", engine="spark"),
                 lambda: cdf.changes(t, 0, engine="spark"), lambda: cdf.deleted_rows(t, engine="spark")):
        with pytest.raises(lineage.InvalidArgumentError, match="no active session"):
            call()
    assert t.version == 2 and t.count() == 4


def test_a_spark_upsert_by_join_sends_the_driver_no_row_per_matched_key(spark, warehouse, monkeypatch) -> None:
    from lineage.writes import spark as spark_writes

    crossed = {}
    for n in (8, 800):
        t = lineage.create_table(f"s.u{n}", SCHEMA, key=["id"], warehouse=warehouse)
        for start in range(0, 1600, 400):
            t.append(_batch(start, 400))  # four data files
        batch = spark.createDataFrame(_batch(0, 1600).take(pa.array(np.arange(0, 1600, 1600 // n))))
        counts = _collected_rows(monkeypatch, spark)
        info = spark_writes.upsert(t._context, batch, "merge-on-read", "join")
        crossed[n] = sum(counts)
        monkeypatch.undo()
        assert (info.updated, info.inserted, t.count()) == (n, 0, 1600)
    assert crossed[8] == crossed[800] <= 4 + 1 + 1  # a summary per data file, the index segment, the written file


@pytest.mark.parametrize(("granularity", "files"), [("file", 6), ("partition", 2), ("auto-2", 2), ("auto-3", 6)])
def test_executors_group_delete_files_as_the_table_says(spark, warehouse, granularity, files) -> None:
    # auto-<n>: granularity unset, a partition in which the commit deletes from more than n data files gets one delete file
    props = ({"lineage.write.delete.file-scoped-limit": granularity[5:]} if granularity.startswith("auto")
             else {"write.delete.granularity": granularity})
    tables = [lineage.create_table(f"s.{n}", SCHEMA, key=["id"], partition_by=["bucket(2, id)"], warehouse=warehouse,
                                   properties=props) for n in ("embedded", "spark")]
    for t in tables:
        for start in range(0, 60, 20):
            t.append(_batch(start, 20))  # three appends: three data files per bucket
    embedded, on_spark = tables
    a = embedded.delete("id % 3 = 0")
    b = on_spark.delete("id % 3 = 0", engine="spark", spark=spark)
    assert (a.deleted, a.delete_files_added) == (b.deleted, b.delete_files_added) == (20, files)
    _same(embedded, on_spark)
    assert _rows(cdf.deleted_rows(on_spark)) == _rows(cdf.deleted_rows(embedded))


def test_an_update_task_writes_its_new_images_in_bounded_pieces(spark, warehouse, monkeypatch) -> None:
    """Each task writes its new images as data files whenever the flush size of them is held (the embedded engine's rule
    for large updates), instead of the job's last task writing every image: more files, the same rows, ids and feed."""
    import lineage.writes.spark_onepass as onepass

    tables = [lineage.create_table(f"s.{n}", SCHEMA, key=["id"], warehouse=warehouse) for n in ("embedded", "spark")]
    for t in tables:
        for start in range(0, 1200, 300):
            t.append(_batch(start, 300))  # four data files, dealt to the session's tasks
    embedded, on_spark = tables
    embedded.update("id % 4 = 0", {"name": "'x'"})
    whole = on_spark.update("id % 4 = 0", {"name": "'x'"}, engine="spark", spark=spark)  # held whole: one file, as embedded
    assert whole.data_files_added == 1
    a = embedded.update("id % 2 = 0", {"amount": "amount + 1"})
    monkeypatch.setattr(onepass, "FLUSH_BYTES", 1)  # travels with the job: every batch a task matches is written at once
    b = on_spark.update("id % 2 = 0", {"amount": "amount + 1"}, engine="spark", spark=spark)
    assert (a.committed, a.updated) == (b.committed, b.updated) == (True, 600)
    assert b.data_files_added > 1
    _same(embedded, on_spark)
    for net in (False, True):
        assert _rows(cdf.changes(on_spark, 0, net=net)) == _rows(cdf.changes(embedded, 0, net=net))


def test_a_failed_spark_write_leaves_no_file_and_a_successful_one_no_scratch(spark, warehouse) -> None:
    """The update's last task fails (a NULL for a required column): the files its first job's tasks wrote (delete files,
    removed keys, index rows, images) are deleted with the job, and the table is untouched. After writes that succeed,
    no scratch file or ledger is left."""
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("qty", pa.int64(), False), ("name", pa.string())])
    t = lineage.create_table("s.fails", schema, key=["id"], warehouse=warehouse)
    for start in range(0, 1200, 300):
        t.append(pa.table({"id": range(start, start + 300), "qty": range(start, start + 300), "name": ["a"] * 300}, schema=schema))
    root = os.path.join(warehouse, "s", "fails")

    def files() -> list[str]:
        return sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)

    before, version = files(), t.version
    with pytest.raises(Exception, match="qty"):  # noqa: PT011 - Spark wraps the task's error
        t.update("id % 2 = 0", {"qty": "CASE WHEN id < 900 THEN qty + 1 ELSE NULL END"}, engine="spark", spark=spark)
    assert files() == before and t.refresh().version == version
    assert t.update("id % 2 = 0", {"qty": "qty + 1"}, engine="spark", spark=spark).updated == 600
    t.upsert(spark.createDataFrame(pa.table({"id": [1, 5000], "qty": [7, 8], "name": ["u", "n"]}, schema=schema)))
    assert t.delete("id % 3 = 0", engine="spark", spark=spark).deleted > 0
    left = [f for f in files() if f.endswith(("-wrote.json", "-rows.arrow", "-images.arrow", "-removed-keys.parquet"))]
    assert left == []
    assert t.count() == 1201 - 400
