"""The predicate pass of Spark deletes and updates (lineage.spark_match): only the columns it needs, the embedded answers.

Each executor task reads its file's predicate columns itself, applies the file's deletes and evaluates the
checked predicate; the other columns are read for the matched rows only. These tests check what a task
reads (in this process, on the task's own function), that no row goes through the JVM to be tested, and
that rows of a column added by schema evolution, or removed by an earlier delete, match on Spark exactly
as they do embedded.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cdf
import lineage
import lineage.spark as spark_io
import lineage.spark_match as spark_match
from conftest import rows
from lineage.columns import LINEAGE_SCHEMA
from lineage.iceberg.schema import projection_field_ids
from lineage.sql.predicate import parse_predicate
from lineage.state import state_at
from lineage.storage.fileio import local_path

WIDE = pa.schema([("id", pa.int64())] + [(f"c{i}", pa.int64()) for i in range(1, 12)] + [("name", pa.string())])


def _wide(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, **{f"c{i}": (ids * i) % 13 for i in range(1, 12)}, "name": [f"n{i % 7}" for i in ids]}, schema=WIDE)


def _spec(t: lineage.Table, where: str, select: str, out: pa.Schema) -> spark_match.MatchPass:
    state = state_at(t.iceberg)
    pred = parse_predicate(where, pa.schema(list(WIDE) + LINEAGE_SCHEMA))
    return spark_match.match_pass(WIDE, projection_field_ids(state.iceberg.metadata), pred, select, out)


def _parquet_columns(t: lineage.Table, spec: spark_match.MatchPass) -> set[str]:
    """The data columns the tasks' DuckDB plans read from Parquet (projected or filtered on), over every slice."""
    found: set[str] = set()

    def walk(node: dict) -> None:
        if node.get("name") == "READ_PARQUET":
            info = node.get("extra_info", {})
            text = " ".join(info.get("Projections", [])) if isinstance(info.get("Projections"), list) else str(info.get("Projections", ""))
            text += " " + (" ".join(info["Filters"]) if isinstance(info.get("Filters"), list) else str(info.get("Filters", "")))
            found.update(c for c in WIDE.names if re.search(rf"\b{c}\b", text))
        for child in node.get("children", []):
            walk(child)

    for task in spark_match.slices(state_at(t.iceberg).live_files()):
        con = spark_match.open_slice(task, spec)
        try:
            for plan in json.loads(con.execute("EXPLAIN (FORMAT json) " + spark_match.slice_sql(task, spec)).fetchall()[0][1]):
                walk(plan)
        finally:
            con.close()
    return found


def _run_tasks(t: lineage.Table, spec: spark_match.MatchPass, slice_rows: int | None = None) -> pa.Table:
    """The pass run in this process, task by task, as the executors run it."""
    got = [b for task in spark_match.slices(state_at(t.iceberg).live_files(), slice_rows) for b in spark_match.evaluate_slice(task, spec)]
    return pa.Table.from_batches(got, schema=spec.out)


def test_the_predicate_pass_reads_only_the_columns_it_names(warehouse) -> None:
    t = lineage.create_table("s.wide", WIDE, key=["id"], warehouse=warehouse)
    t.append(_wide(0, 300))
    t.append(_wide(300, 200))
    t.delete("id % 10 = 0")  # 50 rows gone: their c7 = 5 rows must not match
    live = t.scan().to_pylist()
    matched = sorted(r["id"] for r in live if r["c7"] == 5)

    pointer = pa.schema([("__path", pa.string()), ("__pos", pa.int64()), ("_row_id", pa.int64())])
    spec = _spec(t, "c7 = 5", "__path, __pos, _row_id", pointer)
    assert _parquet_columns(t, spec) == {"c7"}  # a delete without key index or capture: the predicate's column alone
    by_row_id = {r["_row_id"]: r for r in live}
    assert sorted(by_row_id[i]["id"] for i in _run_tasks(t, spec).column("_row_id").to_pylist()) == matched

    keyed = _spec(t, "c7 = 5 AND _row_last_updated_at_version <= 2", '"id" AS __old_key_0, __pos', pa.schema([("__old_key_0", pa.int64()), ("__pos", pa.int64())]))
    assert _parquet_columns(t, keyed) == {"c7", "id"}
    assert sorted(_run_tasks(t, keyed).column("__old_key_0").to_pylist()) == matched

    image = pa.schema([f.with_nullable(True) for f in WIDE] + [pa.field("_row_id", pa.int64())])
    whole = _spec(t, "c7 = 5", ", ".join(f'"{c}"' for c in image.names), image)
    assert _parquet_columns(t, whole) == set(WIDE.names)  # an update's new images: every column (of the matched rows)
    got = _run_tasks(t, whole).to_pylist()
    assert sorted(r["id"] for r in got) == matched
    assert all(r == {c: by_row_id[r["_row_id"]][c] for c in image.names} for r in got)


def test_a_file_split_into_slices_matches_every_row_once(warehouse) -> None:
    t = lineage.create_table("s.groups", WIDE, key=["id"], warehouse=warehouse, properties={"write.parquet.row-group-limit": "64"})
    t.append(_wide(0, 1000))  # 16 row groups of 64 rows
    t.delete("id % 3 = 0")
    assert pq.ParquetFile(local_path(state_at(t.iceberg).live_files()[0].path)).num_row_groups == 16
    out = pa.schema([("id", pa.int64()), ("_row_id", pa.int64()), ("__pos", pa.int64())])
    spec = _spec(t, "c2 < 6 OR _row_id > 990", "id, _row_id, __pos", out)
    assert len(spark_match.slices(state_at(t.iceberg).live_files(), 300)) == 4
    got = _run_tasks(t, spec, slice_rows=300)
    expected = [r["id"] for r in t.scan().to_pylist() if r["c2"] < 6 or r["_row_id"] > 990]
    assert sorted(got.column("id").to_pylist()) == sorted(expected)
    assert got.column("id").to_pylist() == got.column("_row_id").to_pylist() == got.column("__pos").to_pylist()  # one append


@pytest.mark.spark
def test_no_row_goes_through_the_jvm_to_be_tested(spark, warehouse) -> None:
    t = lineage.create_table("s.plan", WIDE, key=["id"], warehouse=warehouse)
    t.append(_wide(0, 100))
    state = state_at(t.iceberg)
    pred = parse_predicate("c3 > 4", pa.schema(list(WIDE) + LINEAGE_SCHEMA))
    out = pa.schema([("__path", pa.string()), ("__pos", pa.int64())])
    df = spark_io.evaluate(spark, state, state.live_files(), pred, "__path, __pos", out)
    plan = df._jdf.queryExecution().optimizedPlan().toString()
    assert "Range" in plan and "Relation" not in plan and "parquet" not in plan.lower()  # task numbers in, matches out
    assert df.columns == ["__path", "__pos"] and df.count() == sum(1 for r in _wide(0, 100).to_pylist() if r["c3"] > 4)


def _twins(warehouse: str, version: int, **kw) -> tuple[lineage.Table, lineage.Table]:  # type: ignore[no-untyped-def]
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
    return tuple(lineage.create_table(f"s.{n}", schema, key=["id"], warehouse=warehouse, format_version=version, **kw)
                 for n in ("embedded", "spark"))  # type: ignore[return-value]


def _same(embedded: lineage.Table, on_spark: lineage.Table) -> None:
    def drop_tz(tbl: pa.Table) -> pa.Table:  # commit timestamps differ between the twins
        return tbl.drop_columns([f.name for f in tbl.schema if pa.types.is_timestamp(f.type) and f.type.tz])

    assert embedded.version == on_spark.version
    assert rows(on_spark.scan()) == rows(embedded.scan())
    for net in (False, True):
        assert rows(drop_tz(cdf.changes(on_spark, 0, net=net))) == rows(drop_tz(cdf.changes(embedded, 0, net=net)))
    assert rows(drop_tz(cdf.deleted_rows(on_spark))) == rows(drop_tz(cdf.deleted_rows(embedded)))


@pytest.mark.spark
def test_a_predicate_over_a_column_added_by_schema_evolution_matches_as_embedded(spark, warehouse) -> None:
    from pyiceberg.types import StringType

    first = pa.table({"id": np.arange(0, 20), "name": [f"n{i}" for i in range(20)], "amount": np.arange(20) * 1.5})
    tables = _twins(warehouse, 2)  # pyiceberg evolves the schema of format version 2 tables only
    for t in tables:
        t.append(first)
        with t.iceberg.update_schema() as u:
            u.add_column("note", StringType())
            u.rename_column("name", "label")
        t.refresh()
        t.append(pa.table({"id": np.arange(20, 30), "label": [f"m{i}" for i in range(20, 30)], "amount": np.arange(20, 30) * 1.5,
                           "note": [None if i % 3 == 0 else f"x{i % 2}" for i in range(20, 30)]}))
    embedded, on_spark = tables
    a, b = embedded.delete("note IS NULL AND id % 2 = 0"), on_spark.delete("note IS NULL AND id % 2 = 0", engine="spark", spark=spark)
    assert a.deleted == b.deleted == 10 + 1  # the first file's even rows (no note), and 24 (of 21, 24, 27: no note)
    _same(embedded, on_spark)
    where, set_ = "note = 'x1' OR label LIKE 'n1%'", {"note": "coalesce(note, '') || '!'", "amount": "amount + 1"}
    a, b = embedded.update(where, set_), on_spark.update(where, set_, engine="spark", spark=spark)
    assert a.updated == b.updated > 0
    _same(embedded, on_spark)


@pytest.mark.spark
@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("granularity", ["file", "partition"])
def test_rows_removed_by_an_earlier_delete_never_match_on_spark(spark, warehouse, version, granularity) -> None:
    tables = _twins(warehouse, version, properties={"write.delete.granularity": granularity})
    for t in tables:
        for start in range(0, 60, 20):
            t.append(pa.table({"id": np.arange(start, start + 20), "name": [f"n{i}" for i in range(start, start + 20)],
                               "amount": np.arange(start, start + 20) * 1.0}))
        t.delete("id % 4 = 0")  # embedded on both: delete files (or deletion vectors) in every data file
    embedded, on_spark = tables
    on_spark.delete("id = 5", engine="spark", spark=spark)  # and one written by Spark
    embedded.delete("id = 5")
    a, b = embedded.delete("id < 30"), on_spark.delete("id < 30", engine="spark", spark=spark)
    assert a.deleted == b.deleted == 30 - 8 - 1
    _same(embedded, on_spark)
    a, b = embedded.update("amount >= 0", {"amount": "-amount"}), on_spark.update("amount >= 0", {"amount": "-amount"}, engine="spark", spark=spark)
    assert a.updated == b.updated == 30 - 7  # ids 30..59 less the multiples of 4 (32 ... 56)
    _same(embedded, on_spark)
    # the updated rows' old images (amount >= 0) are deleted positions of the old files: nothing is left to match
    assert not on_spark.delete("amount >= 0", engine="spark", spark=spark).committed


@pytest.mark.spark
def test_spark_deletes_and_updates_an_s3_table_as_embedded(s3, spark) -> None:
    """The tasks' DuckDB reads the object store through httpfs, with the bucket settings the driver ships them."""
    tables = []
    for name in ("embedded", "spark"):
        t = lineage.create_table(f"shop.{name}", WIDE, key=["id"], properties={"lineage.cdf.capture-preimages": "true"}, **s3.where())
        t.append(_wide(0, 40))
        t.append(_wide(40, 40))
        t.delete("id % 5 = 0")
        tables.append(t)
    embedded, on_spark = tables
    a, b = embedded.delete("c3 = 1 OR id = 41"), on_spark.delete("c3 = 1 OR id = 41", engine="spark", spark=spark)
    assert a.deleted == b.deleted > 0
    a, b = embedded.update("c4 < 3", {"name": "name || '?'"}), on_spark.update("c4 < 3", {"name": "name || '?'"}, engine="spark", spark=spark)
    assert a.updated == b.updated > 0
    _same(embedded, on_spark)


def test_slices_are_dealt_to_one_wave_of_tasks_evenly(warehouse) -> None:
    t = lineage.create_table("s.deal", WIDE, key=["id"], warehouse=warehouse)
    for start, n in ((0, 50), (50, 10), (60, 30), (90, 30), (120, 20)):
        t.append(_wide(start, n))
    pieces = spark_match.slices(state_at(t.iceberg).live_files())
    dealt = spark_match.deal(pieces, 2)
    assert sorted(sum(p.end - p.start for p in task) for task in dealt) == [70, 70]  # 50+20 and 30+30+10
    assert sorted(p.file.path for task in dealt for p in task) == sorted(p.file.path for p in pieces)
    assert len(spark_match.deal(pieces, 16)) == 5 and len(spark_match.deal(pieces[:1], 4)) == 1
