"""Deletes and updates on Spark executors: the same rows, row ids, lineage and feed as the embedded engine.

A model-based test runs one random sequence of deletes and updates on two tables built alike, one written
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
def test_spark_deletes_and_updates_match_the_embedded_engine(spark, tmp_path_factory, data) -> None:
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
        if data.draw(st.booleans(), label="delete?"):
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


def test_a_spark_delete_matching_nothing_commits_nothing(spark, warehouse) -> None:
    t = lineage.create_table("s.t", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch(0, 5))
    info = t.delete("id > 100", engine="spark", spark=spark)
    assert not info.committed and t.version == 1


def _collected_rows(monkeypatch, spark) -> list[int]:
    """Count the rows every ``collect``/``toArrow`` hands the driver (what crosses from the executors)."""
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

    monkeypatch.setattr(cls, "collect", counted_collect)
    monkeypatch.setattr(cls, "toArrow", counted_to_arrow)
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
    assert crossed[4][0] == crossed[800][0] <= 4 + 1
    assert crossed[4][1] == crossed[800][1] <= 4 + 1 + 1  # and one descriptor per written data file
