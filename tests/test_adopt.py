"""Adoption (``lineage.adopt``): existing Iceberg v2 tables become lineage tables without a data file rewritten.

Tables written by pyiceberg and by Spark 3.5 + Iceberg 1.10 (the reference engine: partitioned, merge-on-read
deletes and updates, MERGE, Flink-style equality deletes) are adopted; our scan must equal Spark's read, every live
row gets a row id with created = updated = the adoption version, and our writes and change feed work afterwards.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from conftest import rows

import lineage
from cdf import api as cdf
from lineage.catalog import resolve_catalog
from lineage.errors import InvalidArgumentError, KeyViolationError, RetentionError, UnknownColumnError
from lineage.maintenance import verify

PLAIN = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _pyiceberg_table(warehouse: str, name: str = "shop.plain"):  # type: ignore[no-untyped-def]
    cat = resolve_catalog(warehouse, None)
    try:
        cat.create_namespace("shop")
    except Exception:  # noqa: BLE001 - exists
        pass
    ice = cat.create_table(name, schema=PLAIN)
    ice.append(pa.table({"id": [1, 2, 3, 4], "name": ["a", "b", "c", "d"]}, schema=PLAIN))
    ice.delete("id = 2")
    ice.append(pa.table({"id": [5], "name": ["e"]}, schema=PLAIN))
    return ice


def test_adopt_a_pyiceberg_table(warehouse):
    ice = _pyiceberg_table(warehouse)
    history = len(ice.metadata.snapshots)
    with pytest.raises(InvalidArgumentError, match="lineage.adopt"):
        lineage.open_table("shop.plain", warehouse=warehouse)
    with pytest.raises(UnknownColumnError):
        lineage.adopt("shop.plain", key=["nope"], warehouse=warehouse)
    ice.refresh()
    assert len(ice.metadata.snapshots) == history  # refused: untouched

    adopted = lineage.adopt("shop.plain", key=["id"], warehouse=warehouse)
    v = adopted.version
    assert v == history + 1 and adopted.key == ("id",) and adopted.converted == 0
    t = lineage.open_table("shop.plain", warehouse=warehouse)
    ours = t.scan()
    assert rows(ours, PLAIN.names) == rows(t.iceberg.scan().to_arrow(), PLAIN.names)
    assert sorted(ours.column("_row_id").to_pylist()) == sorted(set(ours.column("_row_id").to_pylist()))
    assert set(ours.column("_row_created_at_version").to_pylist()) == {v} == set(ours.column("_row_last_updated_at_version").to_pylist())
    assert t.key == ["id"] and [c.operation for c in t.history()] == ["adopt"]
    assert t.iceberg.metadata.current_snapshot().summary.operation.value == "replace"
    assert not verify(t).problems

    ids = {r["id"]: r["_row_id"] for r in ours.to_pylist()}
    t.upsert(pa.table({"id": [3, 9], "name": ["C", "i"]}))
    t.delete("id = 1")
    after = {r["id"]: r for r in t.scan().to_pylist()}
    assert after[3]["_row_id"] == ids[3] and after[3]["_row_created_at_version"] == v and after[3]["_row_last_updated_at_version"] == v + 1
    assert after[9]["_row_id"] not in ids.values() and 1 not in after
    feed = cdf.changes(t, from_version=v)
    assert sorted((r["id"], r["_change_type"]) for r in feed.to_pylist()) == [
        (1, "delete"), (3, "update_postimage"), (3, "update_preimage"), (9, "insert")
    ]
    with pytest.raises(RetentionError, match=f"adopted.*version {v}"):
        cdf.changes(t, from_version=v - 1)
    with pytest.raises(InvalidArgumentError, match="lineage table already"):
        lineage.adopt("shop.plain", warehouse=warehouse)
    assert not verify(t).problems


def test_adopt_refuses_bad_keys_and_leaves_the_table_alone(warehouse):
    ice = _pyiceberg_table(warehouse)
    ice.append(pa.table({"id": [None, 3], "name": ["null", "again"]}, schema=PLAIN))
    history = len(ice.metadata.snapshots)
    with pytest.raises(KeyViolationError, match="NULL key"):
        lineage.adopt("shop.plain", key=["id"], warehouse=warehouse)
    ice.delete("id IS NULL")
    history = len(ice.refresh().metadata.snapshots)
    with pytest.raises(KeyViolationError):  # id 3 twice
        lineage.adopt("shop.plain", key=["id"], warehouse=warehouse)
    ice.refresh()
    assert len(ice.metadata.snapshots) == history and "lineage.enabled" not in ice.metadata.properties
    assert not ice.schema().identifier_field_ids
    # Without a key it is adopted as a keyless table.
    adopted = lineage.adopt("shop.plain", warehouse=warehouse)
    t = adopted.table
    assert adopted.key == () and t.key == [] and t.count() == 5
    t.append(pa.table({"id": [7], "name": ["g"]}))
    assert t.count() == 6 and rows(t.scan(with_lineage=False)) == rows(t.iceberg.scan().to_arrow())


def _spark_table(reference, warehouse):  # type: ignore[no-untyped-def]
    resolve_catalog(warehouse, None).create_namespace("shop")
    reference.sql(
        warehouse,
        "CREATE TABLE shop.sales (id BIGINT, region STRING, amount DOUBLE) USING iceberg PARTITIONED BY (region) "
        "TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
        "'write.merge.mode'='merge-on-read')",
    )
    reference.sql(warehouse, "INSERT INTO shop.sales VALUES (1, 'eu', 1.0), (2, 'eu', 2.0), (3, 'us', 3.0), (4, 'us', 4.0)")
    reference.sql(warehouse, "INSERT INTO shop.sales VALUES (5, 'ap', 5.0), (6, 'eu', 6.0)")
    reference.sql(warehouse, "DELETE FROM shop.sales WHERE id = 2")
    reference.sql(warehouse, "UPDATE shop.sales SET amount = amount * 10 WHERE region = 'us'")
    reference.sql(
        warehouse,
        "MERGE INTO shop.sales t USING src s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        views={"src": pa.table({"id": [5, 7], "region": ["ap", "us"], "amount": [55.0, 7.0]})},
    )


def _spark(reference, warehouse, name="shop.sales"):  # type: ignore[no-untyped-def]
    return rows(reference.read(warehouse, name).select(["id", "region", "amount"]))


def test_adopt_a_spark_table_with_merge_on_read_history(reference, warehouse):
    _spark_table(reference, warehouse)
    # A Flink-style commit with equality deletes on top: adoption converts them first.
    reference.flink_commit(warehouse, "shop.sales", [("+I", {"id": 6, "region": "eu", "amount": 60.0}), ("-D", {"id": 1, "region": "eu"})],
                           key=["id", "region"], upsert=True)
    before = _spark(reference, warehouse)
    adopted = lineage.adopt("shop.sales", key=["id", "region"], warehouse=warehouse)
    assert adopted.converted >= 1
    t = adopted.table
    assert rows(t.scan(with_lineage=False), ["id", "region", "amount"]) == before == _spark(reference, warehouse)
    assert t.count() == len(before) and not verify(t).problems
    v = adopted.version
    t.upsert(pa.table({"id": [3, 8], "region": ["us", "ap"], "amount": [0.5, 8.0]}))
    t.delete("id = 4")
    assert _spark(reference, warehouse) == rows(t.scan(with_lineage=False), ["id", "region", "amount"])
    feed = cdf.changes(t, from_version=v).to_pylist()
    assert sorted((r["id"], r["_change_type"]) for r in feed) == [(3, "update_postimage"), (3, "update_preimage"), (4, "delete"), (8, "insert")]
    reference.forget(warehouse)


def test_adopt_command(warehouse):
    """``lineage adopt``: a plain table is refused by other commands with a hint, adopted, then readable."""
    import json

    from test_cli import fails, ok, run

    _pyiceberg_table(warehouse)
    fails(run("--warehouse", warehouse, "scan", "shop.plain"), 2, "lineage adopt shop.plain")
    done = json.loads(ok(run("--warehouse", warehouse, "-f", "json", "adopt", "shop.plain", "--key", "id")).stdout)
    assert done["table"] == "shop.plain" and done["key"] == ["id"] and done["rows"] == 4 and done["data_files"] == 2
    scanned = ok(run("--warehouse", warehouse, "-f", "json", "scan", "shop.plain")).stdout
    assert sorted(r["id"] for r in json.loads(scanned)) == [1, 3, 4, 5]
    fails(run("--warehouse", warehouse, "adopt", "shop.plain"), 2, "already")


def test_adopt_converts_equality_deletes_also_those_added_meanwhile(warehouse, monkeypatch):
    """Equality deletes (written here by the equality strategy on the plain table) are converted before adoption;
    a writer adding more while adoption plans makes it convert again and plan anew."""
    import lineage.adoption as adopt_module
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    cat = resolve_catalog(warehouse, None)
    cat.create_namespace("shop")
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()), identifier_field_ids=[1])
    ice = cat.create_table("shop.cdc", schema=schema, properties={"write.changelog.strategy": "equality"})
    ice.append(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]}, schema=pa.schema([pa.field("id", pa.int64(), False), ("name", pa.string())])))
    model = {1: "a", 2: "b", 3: "c"}

    def changelog(items):  # type: ignore[no-untyped-def]
        writer = lineage.Table(cat.load_table("shop.cdc"), cat)  # a plain table: the equality strategy needs no lineage
        writer.apply_changelog(pa.table({"_op": [o for o, _, _ in items], "id": [k for _, k, _ in items], "name": [n for _, _, n in items]}), upsert=True)
        for op, k, n in items:
            if op == "-D":
                model.pop(k, None)
            else:
                model[k] = n

    changelog([("+U", 1, "A"), ("-D", 2, None), ("+I", 4, "d")])
    real = adopt_module.plan_snapshot
    calls: list[int] = []

    def plan_and_race(table, snapshot):  # type: ignore[no-untyped-def]
        if not calls:
            changelog([("-D", 3, None), ("+I", 5, "e")])
        calls.append(1)
        return real(table, snapshot)

    monkeypatch.setattr(adopt_module, "plan_snapshot", plan_and_race)
    adopted = lineage.adopt("shop.cdc", warehouse=warehouse)
    assert adopted.converted == 2 and adopted.key == ("id",) and len(calls) >= 2
    t = adopted.table
    assert {r["id"]: r["name"] for r in t.scan().to_pylist()} == model
    assert not verify(t).problems
