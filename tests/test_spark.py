"""Spark engine: same change feed, scans and writes as the DuckDB path (one shared session)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

import cdf
import cdf.spark
import lineage
from conftest import SCHEMA, assert_interop, rename_and_add_a_column, rows
from lineage.maintenance.key_index import check_key_index
from lineage.writes import spark as spark_writes

pytestmark = pytest.mark.spark


def _random_history(table: lineage.Table, seed: int, steps: int = 7) -> None:
    rnd = random.Random(seed)
    next_id = 0
    for _ in range(steps):
        op = rnd.choice(["append", "update", "delete", "upsert", "update_cow"])
        if op == "append" or next_id == 0:
            n = rnd.randint(1, 6)
            table.append(pa.table({"id": list(range(next_id, next_id + n)), "name": [rnd.choice("ab") for _ in range(n)],
                                   "amount": [float(rnd.randint(0, 3)) for _ in range(n)]}, schema=SCHEMA))
            next_id += n
        elif op == "update":
            table.update(f"id % {rnd.randint(2, 4)} = {rnd.randint(0, 1)}", {"amount": "amount + 1"})
        elif op == "update_cow":
            table.update(f"name = '{rnd.choice('ab')}'", {"name": "'c'"}, mode="copy-on-write")
        elif op == "delete":
            table.delete(f"id % {rnd.randint(3, 5)} = {rnd.randint(0, 2)}")
        else:
            ids = [rnd.randrange(next_id + 3) for _ in range(3)]
            ids = sorted(set(ids))
            table.upsert(pa.table({"id": ids, "name": ["u"] * len(ids), "amount": [9.0] * len(ids)}, schema=SCHEMA))
            next_id = max(next_id, max(ids) + 1)


# Spark reports a file's path URL-encoded (`_metadata.file_path`), so a warehouse whose path has spaces or '%'
# must still match every pointed row. (No non-ASCII letter here: whether the JVM can name such a file depends
# on the machine's locale, not on this library; tests/test_warehouse_paths.py covers them without Spark.)
ODD_FOLDER = "lake with spaces+%25"


@pytest.mark.parametrize("seed, partition_by, capture, folder", [
    (1, None, False, "wh"), (7, ["bucket(4, id)"], True, "wh"), (3, None, False, ODD_FOLDER), (5, None, True, ODD_FOLDER),
])
def test_spark_and_duckdb_agree(spark, tmp_path, seed, partition_by, capture, folder):
    warehouse = str(tmp_path / folder)
    t = lineage.create_table("s.eq", SCHEMA, key=["id"], partition_by=partition_by, warehouse=warehouse,
                             properties={"lineage.cdf.capture-preimages": str(capture).lower()})
    _random_history(t, seed)
    current = t.version
    rnd = random.Random(seed)
    pairs = {(0, current), (current - 1, current)} | {tuple(sorted(rnd.sample(range(current + 1), 2))) for _ in range(2)}
    for a, b in sorted(pairs):
        for net in (False, True):
            theirs = cdf.changes(t, a, b, net=net, engine="spark", spark=spark).toArrow()
            ours = cdf.changes(t, a, b, net=net)
            assert theirs.column_names == ours.column_names
            assert rows(theirs) == rows(ours), (a, b, net)
    assert rows(cdf.deleted_rows(t, engine="spark", spark=spark).toArrow()) == rows(cdf.deleted_rows(t))
    for v in (current, max(1, current - 2)):
        assert rows(t.to_spark(spark, as_of=v).toArrow()) == rows(t.scan(as_of=v))


def test_spark_feed_never_collects_rows(spark, warehouse, monkeypatch):
    """Building the Spark feed and deleted_rows runs no Spark action, and the driver builds no pointer: it ships
    metadata paths and row-id ranges, executors (other processes, which this test's patches do not reach) plan and read."""
    from pyspark.sql import DataFrame

    import cdf.engine_duckdb
    import cdf.stream
    import cdf.pointers

    t = lineage.create_table("s.lazy", SCHEMA, key=["id"], warehouse=warehouse)
    _random_history(t, 3)
    expected = rows(cdf.deleted_rows(t))

    def planned_on_driver(*args, **kwargs):
        raise AssertionError("the driver planned the feed's pointers")

    monkeypatch.setattr(cdf.pointers, "change_pointers", planned_on_driver)
    monkeypatch.setattr(cdf.pointers.PointerSources, "pointers", planned_on_driver)
    monkeypatch.setattr(cdf.engine_duckdb, "change_pointers", planned_on_driver)
    monkeypatch.setattr(cdf.stream, "change_pointers", planned_on_driver)
    actions = []
    for name in ("collect", "toArrow", "toPandas", "take", "count", "toLocalIterator"):
        original = getattr(DataFrame, name)

        def spy(self, *args, _name=name, _original=original, **kwargs):
            actions.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(DataFrame, name, spy)
    df = cdf.changes(t, 0, engine="spark", spark=spark)
    net = cdf.changes(t, 0, net=True, engine="spark", spark=spark)
    deleted = cdf.deleted_rows(t, engine="spark", spark=spark)
    assert actions == []
    assert df.count() >= net.count()
    assert expected and rows(deleted.toArrow()) == expected


def test_writes_from_spark_keep_row_ids_and_interop(spark, warehouse):
    # with pre-image capture: the Spark upsert's plan has no old values, the write loop reads them back by position
    t = lineage.create_table("s.w", SCHEMA, key=["id"], partition_by=["bucket(2, id)"], warehouse=warehouse,
                             properties={"lineage.cdf.capture-preimages": "true"})
    c1 = t.append(spark.createDataFrame(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"], "amount": [1.0, 2.0, 3.0]}, schema=SCHEMA)))
    before = {r["id"]: r["_row_id"] for r in t.scan().to_pylist()}
    c2 = t.upsert(spark.createDataFrame(pa.table({"id": [2, 4], "name": ["B", "d"], "amount": [2.5, 4.0]}, schema=SCHEMA)))
    assert (c1.inserted, c2.updated, c2.inserted) == (3, 1, 1)
    assert c2.delete_files_added >= 1  # merge-on-read: the old image is a position delete
    after = {r["id"]: r for r in t.scan().to_pylist()}
    assert after[2]["_row_id"] == before[2] and after[2]["_row_created_at_version"] == c1.version
    assert after[2]["_row_last_updated_at_version"] == c2.version and after[2]["name"] == "B"
    assert after[4]["_row_id"] not in before.values()
    # The key index follows Spark writes (keys of new rows read from the files the executors wrote).
    assert t.state().lineage.key_index is not None
    assert check_key_index(t.state())[0] == []
    assert_interop(t)
    feed = cdf.changes(t, c1.version)
    assert sorted(feed.column("_change_type").to_pylist()) == ["insert", "update_postimage", "update_preimage"]
    pre = [r for r in feed.to_pylist() if r["_change_type"] == "update_preimage"]
    assert [(r["id"], r["name"], r["amount"]) for r in pre] == [(2, "b", 2.0)]
    segment = t.state().lineage.commits[-1].index
    from index.deleted_rows import read_index

    assert read_index(t.iceberg.io, segment, with_values=True).values.num_rows == 1  # captured


def test_bad_spark_batches_are_refused(spark, warehouse):
    t = lineage.create_table("s.bad", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(pa.table({"id": [1], "name": ["a"], "amount": [1.0]}, schema=SCHEMA))
    snapshot = t.iceberg.metadata.current_snapshot_id
    dup = spark.createDataFrame(pa.table({"id": [5, 5], "name": ["x", "y"], "amount": [1.0, 2.0]}, schema=SCHEMA))
    with pytest.raises(lineage.KeyViolationError, match="more than once"):
        t.upsert(dup)
    null = spark.createDataFrame(pa.table({"id": [5, None], "name": ["x", "y"], "amount": [1.0, 2.0]}, schema=SCHEMA))
    with pytest.raises(lineage.KeyViolationError, match="null in 1 row"):
        t.upsert(null)  # checked on the driver (a batch small enough for the key index lookup)
    with pytest.raises(lineage.KeyViolationError, match="more than once"):
        spark_writes.upsert(t._context, dup, "merge-on-read", strategy="join")  # checked by executors
    extra = spark.createDataFrame(pa.table({"id": [6], "name": ["x"], "amount": [1.0], "oops": [1]}))
    with pytest.raises(lineage.UnknownColumnError, match="oops"):
        t.append(extra)
    with pytest.raises(lineage.InvalidArgumentError, match="merge-on-read"):
        t.upsert(dup, mode="copy-on-write")
    live = spark.createDataFrame(pa.table({"id": [7, 1], "name": ["x", "y"], "amount": [1.0, 2.0]}, schema=SCHEMA))
    with pytest.raises(lineage.KeyViolationError, match="already in the table"):
        t.append(live)  # checked through the key index after the executors wrote; their files are removed
    assert t.refresh().iceberg.metadata.current_snapshot_id == snapshot


def test_spark_views(spark, warehouse):
    t = lineage.create_table("s.views", SCHEMA, key=["id"], warehouse=warehouse)
    _random_history(t, 5)
    assert cdf.spark.register(spark, t) == "views"
    got = spark.sql("SELECT * FROM `views$changes` WHERE _commit_version > 1 AND _commit_version <= 4").toArrow()
    assert rows(got) == rows(cdf.changes(t, 1, min(4, t.version)))
    deleted = spark.sql("SELECT * FROM `views$deleted_rows`").toArrow()
    assert rows(deleted) == rows(cdf.deleted_rows(t))


@pytest.mark.parametrize("capture", [False, True])
def test_spark_feed_carries_every_column_type(spark, warehouse, capture):
    """Values read by executors (data files in mapInArrow, captured segments in SQL) keep their types."""
    import datetime as dt
    import decimal

    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("tsn", pa.timestamp("us")), ("d", pa.date32()),
                        ("dec", pa.decimal128(10, 2)), ("b", pa.bool_()), ("f", pa.float32()), ("s", pa.string()), ("bin", pa.binary())])
    t = lineage.create_table("s.types", schema, key=["id"], warehouse=warehouse,
                             properties={"lineage.cdf.capture-preimages": str(capture).lower()})
    n = 5
    t.append(pa.table({"id": list(range(n)), "ts": [dt.datetime(2024, 1, 1, 12, i, tzinfo=dt.timezone.utc) for i in range(n)],
                       "tsn": [dt.datetime(2024, 1, 2, 3, i) for i in range(n)], "d": [dt.date(2024, 1, i + 1) for i in range(n)],
                       "dec": [decimal.Decimal(f"{i}.25") for i in range(n)], "b": [i % 2 == 0 for i in range(n)],
                       "f": [i * 1.5 for i in range(n)], "s": [f"s{i}" for i in range(n)], "bin": [bytes([i]) for i in range(n)]}, schema=schema))
    t.update("id < 3", {"s": "'changed'"})
    t.delete("id = 4")
    for net in (False, True):
        ours = cdf.changes(t, 0, net=net)
        theirs = cdf.changes(t, 0, net=net, engine="spark", spark=spark).toArrow()
        assert theirs.num_rows == ours.num_rows
        assert rows(theirs.cast(ours.schema)) == rows(ours), net


@pytest.mark.parametrize("capture", [False, True])
def test_spark_feed_matches_columns_by_field_id_after_a_rename(spark, warehouse, capture):
    """Older files carry the old column name: the executors' reads (feed and scan) match by field id, as the embedded engine does."""
    t = lineage.create_table("s.evo", SCHEMA, key=["id"], warehouse=warehouse,
                             properties={"lineage.cdf.capture-preimages": str(capture).lower()})
    rename_and_add_a_column(t)
    for net in (False, True):
        ours = cdf.changes(t, 0, net=net)
        theirs = cdf.changes(t, 0, net=net, engine="spark", spark=spark).toArrow()
        assert "label" in theirs.column_names
        assert rows(theirs.cast(ours.schema)) == rows(ours), net
    scanned = t.to_spark(spark).toArrow()  # Spark's scan reads the older file by field id too
    assert rows(scanned.cast(t.scan().schema)) == rows(t.scan())


def test_the_spark_scan_sends_segment_paths_not_lineage_runs(spark, warehouse, monkeypatch):
    """The driver sends the scan's tasks each file without its lineage runs (the task reads the file's lineage segment),
    and the rows, row ids and lineage columns are the embedded scan's, files an update wrote (a run per row) included."""
    import lineage.spark_match as spark_match

    t = lineage.create_table("s.scan", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(pa.table({"id": list(range(40)), "name": ["a"] * 40, "amount": [float(i) for i in range(40)]}, schema=SCHEMA))
    t.update("id % 3 = 0", {"amount": "amount + 1"})
    t.delete("id % 5 = 0")
    sent = []
    original = spark_match.matches

    def spy(session, files, spec):
        sent.extend(files)
        return original(session, files, spec)

    monkeypatch.setattr(spark_match, "matches", spy)
    got = t.to_spark(spark).toArrow()
    assert sent and all(f.lineage is None for f in sent)
    assert rows(got) == rows(t.scan())
