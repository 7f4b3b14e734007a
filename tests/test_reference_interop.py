"""Interop with a foreign Iceberg engine: Spark 3.5 + Apache Iceberg 1.10 (the ``reference`` fixture).

Reads: Spark reads tables written by this library (appends, merge-on-read deletes/updates/upserts with
position delete files, copy-on-write, bucket/identity/day partitions, after compact and rewrite_deletes,
time travel to older snapshots) and returns exactly the rows and column types of ``Table.scan()``.

Foreign writes, mechanically: Spark SQL (INSERT, DELETE, UPDATE, MERGE, procedures) and Flink-style commits
with equality and position deletes through Iceberg's Java API commit to a table made by
``lineage.create_table``; pyiceberg sees their snapshots and Spark reads the expected rows. How this library
reconciles such snapshots (lineage, change feed, our writes on top) is tested in test_reconcile.py.

Every Spark read costs about half a second once the engine is warm, so examples are few.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import tempfile
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import rows
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from pyiceberg.manifest import DataFileContent
from reference import ReferenceRequestError, SparkError

import lineage
from lineage.catalog import CATALOG_FILE, CATALOG_NAME

pytestmark = pytest.mark.reference

# Every Iceberg primitive type the project's tests use, with the Arrow types Table.scan() returns.
TYPED = pa.schema(
    [
        ("id", pa.int64()),
        ("region", pa.string()),
        ("qty", pa.int32()),
        ("amount", pa.float64()),
        ("price", pa.decimal128(10, 2)),
        ("ok", pa.bool_()),
        ("d", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("local_ts", pa.timestamp("us")),
    ]
)
UTC = dt.timezone.utc
T0 = dt.datetime(2024, 2, 28, 23, 59, 59, 999_999, tzinfo=UTC)


def _row(i: int, variant: int = 0) -> dict:
    """A deterministic typed row for key ``i``: dates before 1970, a leap day, microseconds, nulls."""
    v = i * 7 + variant
    return {
        "id": i,
        "region": [None, "eu", "us", "ap"][v % 4],
        "qty": None if v % 6 == 5 else (v % 11) - 5,
        "amount": None if v % 7 == 6 else v / 4,
        "price": None if v % 9 == 8 else Decimal(v * 37 - 500) / 100,
        "ok": None if v % 8 == 7 else bool(v % 2),
        "d": dt.date(1969, 12, 31) + dt.timedelta(days=(v % 5) * 400 - 401),
        "ts": None if v % 10 == 9 else T0 + dt.timedelta(hours=v % 5 * 13, microseconds=v),
        "local_ts": dt.datetime(2000, 1, 1) + dt.timedelta(days=v % 3, microseconds=v * 3),
    }


def _batch(keys: list[int], variant: int = 0) -> pa.Table:
    return pa.Table.from_pylist([_row(k, variant) for k in keys], schema=TYPED)


def _typed_table(warehouse: str, partition_by: list[str] | None, name: str = "shop.typed") -> lineage.Table:
    return lineage.create_table(name, TYPED, key=["id"], partition_by=partition_by, warehouse=warehouse)


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal Arrow types up to encoding: string = large_string (Iceberg's string), binary = large_binary,
    and timestamp zones "UTC" and "+00:00" are the same zone."""
    if {a, b} <= {pa.string(), pa.large_string()} or {a, b} <= {pa.binary(), pa.large_binary()}:
        return True
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
        utc = {"UTC", "+00:00", "Etc/UTC"}
        return a.unit == b.unit and ((a.tz is None and b.tz is None) or (a.tz in utc and b.tz in utc))
    return a == b


def assert_spark_reads_ours(reference, warehouse: str, table: lineage.Table, version: int | None = None) -> None:
    """Spark's read of ``table`` (at ``version``'s snapshot) has our scan's columns, types and rows."""
    table.refresh()
    ours = table.scan(with_lineage=False, as_of=version)
    snapshot_id = None
    if version is not None:
        snapshot_id = next(c.snapshot_id for c in table.history() if c.version == version)
    theirs = reference.read(warehouse, table.name, snapshot_id=snapshot_id)
    assert theirs.column_names == ours.column_names
    for a, b in zip(theirs.schema, ours.schema, strict=True):
        assert _same_type(a.type, b.type), f"column {a.name}: Spark reads {a.type}, our scan returns {b.type}"
    assert rows(theirs.cast(ours.schema)) == rows(ours), f"Spark and our scan differ at version {version or table.version}"


def test_embedded_catalog_name_is_the_one_the_reference_engine_uses(warehouse):
    """pyiceberg stores CATALOG_NAME in catalog.db; the reference engine's JdbcCatalog must use the same."""
    lineage.create_table("shop.orders", TYPED, key=["id"], warehouse=warehouse)
    con = sqlite3.connect(os.path.join(warehouse, CATALOG_FILE))
    try:
        names = {r[0] for r in con.execute("SELECT catalog_name FROM iceberg_tables")}
    finally:
        con.close()
    assert names == {CATALOG_NAME}


# ---------------------------------------------------------------------- Spark reads our tables


def test_spark_reads_a_table_written_with_lz4(reference, warehouse):
    """The codec README suggests for feed-heavy tables (Parquet's LZ4_RAW) is read by Iceberg 1.10 on Spark."""
    t = lineage.create_table("shop.fast", TYPED, key=["id"], warehouse=warehouse, properties={"write.parquet.compression-codec": "lz4"})
    t.append(_batch(list(range(1, 9))))
    t.upsert(_batch([2, 3, 30], variant=1))
    assert_spark_reads_ours(reference, warehouse, t)
    reference.forget(warehouse)


def test_spark_reads_every_version_of_a_day_partitioned_table(reference, warehouse):
    """All write kinds and both maintenance operations, each version read back by Spark (time travel)."""
    t = _typed_table(warehouse, ["day(ts)"])
    t.append(_batch(list(range(1, 13))))  # v1
    t.delete("qty > 2")  # v2 merge-on-read: position deletes
    t.update("region = 'eu'", {"amount": "amount * 2", "ts": "ts + INTERVAL 1 DAY"}, mode=lineage.COPY_ON_WRITE)  # v3
    t.upsert(_batch([1, 2, 3, 20, 21], variant=1))  # v4 merge-on-read update + insert
    t.rewrite_deletes()  # v5
    t.compact()  # v6
    assert t.version == 6
    for version in range(1, t.version + 1):
        assert_spark_reads_ours(reference, warehouse, t, version)
    # The engine keeps the warehouse's catalog open; our commits must not wait for a lock it holds.
    t.delete("id = 1")
    assert_spark_reads_ours(reference, warehouse, t)
    reference.forget(warehouse)


PARTITIONS = st.sampled_from([None, ["bucket(4, id)"], ["region"], ["day(ts)"], ["bucket(2, id)", "region"]])
PREDICATES = ["id % 3 = 1", "region = 'eu'", "qty > 0", "price IS NULL", "ok", "ts < TIMESTAMPTZ '2024-02-29 12:00:00+00'", "TRUE"]
SETTERS = [
    {"qty": "qty + 1"},
    {"region": "'us'"},  # moves rows between identity partitions
    {"ts": "ts + INTERVAL 1 DAY"},  # moves rows between day partitions
    {"price": "price * 2", "ok": "NOT ok"},
    {"amount": "NULL", "d": "d + 1"},
]
MODES = st.sampled_from([None, lineage.COPY_ON_WRITE])


@st.composite
def operations(draw: st.DrawFn) -> list[tuple]:
    """2 to 6 writes and maintenance operations; keys are drawn from a small range so upserts hit."""
    ops: list[tuple] = [("append", sorted(draw(st.sets(st.integers(1, 30), min_size=1, max_size=8))))]
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["append", "delete", "update", "upsert", "compact", "rewrite_deletes"]))
        if kind in ("append", "upsert"):
            ops.append((kind, sorted(draw(st.sets(st.integers(1, 40), min_size=1, max_size=6))), draw(st.integers(0, 3)), draw(MODES)))
        elif kind == "delete":
            ops.append((kind, draw(st.sampled_from(PREDICATES)), draw(MODES)))
        elif kind == "update":
            ops.append((kind, draw(st.sampled_from(PREDICATES)), draw(st.sampled_from(SETTERS)), draw(MODES)))
        else:
            ops.append((kind,))
    return ops


def _apply(t: lineage.Table, op: tuple) -> None:
    kind = op[0]
    if kind == "append":
        live = set(t.scan(columns=["id"]).column("id").to_pylist())
        keys = [k for k in op[1] if k not in live]  # an append of a live key is a KeyViolationError
        if keys:
            t.append(_batch(keys, op[2] if len(op) > 2 else 0))
    elif kind == "upsert":
        t.upsert(_batch(op[1], op[2]), mode=op[3])
    elif kind == "delete":
        t.delete(op[1], mode=op[2])
    elif kind == "update":
        t.update(op[1], op[2], mode=op[3])
    elif kind == "compact":
        t.compact()
    else:
        t.rewrite_deletes()


@settings(
    max_examples=int(os.environ.get("LINEAGE_REFERENCE_EXAMPLES", "4")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(partition_by=PARTITIONS, ops=operations(), data=st.data())
def test_spark_reads_what_we_scan_after_random_operations(reference, partition_by, ops, data):
    """Property: after any sequence of our writes and maintenance, Spark reads exactly our scan, now and at
    an earlier version (time travel). LINEAGE_REFERENCE_EXAMPLES raises the number of examples."""
    with tempfile.TemporaryDirectory(prefix="ref-prop-") as tmp:
        warehouse = os.path.join(tmp, "wh")
        t = _typed_table(warehouse, partition_by)
        note(f"partition_by={partition_by}")
        for op in ops:
            note(f"v{t.version}: {op}")
            _apply(t, op)
        assert_spark_reads_ours(reference, warehouse, t)
        if t.version > 1:
            older = data.draw(st.integers(1, t.version - 1), label="time travel to version")
            assert_spark_reads_ours(reference, warehouse, t, older)
        reference.forget(warehouse)


# ---------------------------------------------------------------------- foreign writes, mechanically


def _snapshot(t: lineage.Table):  # noqa: ANN202
    t.refresh()
    snap = t.iceberg.metadata.current_snapshot()
    assert snap is not None
    return snap


def test_spark_sql_writes_commit_to_our_table(reference, warehouse):
    """INSERT, DELETE, UPDATE and MERGE by Spark: pyiceberg sees each snapshot, Spark and pyiceberg read the
    expected rows; then Spark's maintenance procedures leave the rows alone."""
    t = _typed_table(warehouse, ["bucket(4, id)"], name="shop.orders")
    t.append(_batch([1, 2, 3, 4]))
    t.delete("id = 4")  # our position delete file, which Spark's DELETE below must respect
    expected = {r["id"]: r for r in _batch([1, 2, 3]).to_pylist()}
    seq = _snapshot(t).sequence_number

    def check(operation: str) -> None:
        nonlocal seq
        snap = _snapshot(t)
        seq += 1
        assert snap.sequence_number == seq
        assert snap.summary.operation.value == operation
        assert snap.summary.additional_properties.get("engine-name") == "spark"
        want = rows(pa.Table.from_pylist(list(expected.values()), schema=TYPED))
        spark_rows = reference.read(warehouse, "shop.orders")
        assert rows(spark_rows.cast(TYPED)) == want
        assert rows(t.iceberg.scan().to_arrow().select(TYPED.names).cast(TYPED)) == want  # pyiceberg reads Spark's files

    reference.sql(warehouse, "INSERT INTO shop.orders SELECT * FROM new_rows", views={"new_rows": _batch([5, 6])})
    expected.update({r["id"]: r for r in _batch([5, 6]).to_pylist()})
    check("append")

    # The table's properties (set by create_table) make Spark write position deletes: merge-on-read.
    reference.sql(warehouse, "DELETE FROM shop.orders WHERE id = 2")
    del expected[2]
    check("delete")  # a RowDelta of delete files only

    reference.sql(warehouse, "UPDATE shop.orders SET qty = 100 WHERE id IN (1, 5)")
    for k in (1, 5):
        expected[k] = {**expected[k], "qty": 100}
    check("overwrite")

    reference.sql(
        warehouse,
        "MERGE INTO shop.orders t USING src s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        views={"src": _batch([3, 7], variant=2)},
    )
    expected.update({r["id"]: r for r in _batch([3, 7], variant=2).to_pylist()})
    check("overwrite")

    files = reference.sql(warehouse, "SELECT content, file_path FROM shop.orders.files").to_pylist()
    assert any(f["content"] == 1 for f in files), "Spark's merge-on-read DML wrote no position delete file"
    assert all(f["file_path"].startswith(warehouse + os.sep) for f in files), "paths must be plain absolute paths"

    # Maintenance by the foreign engine: the rows stay what they are.
    reference.sql(warehouse, "CALL system.rewrite_position_delete_files(table => 'shop.orders', options => map('rewrite-all', 'true'))")
    done = reference.sql(warehouse, "CALL system.rewrite_data_files(table => 'shop.orders', options => map('rewrite-all', 'true'))")
    assert done.column("rewritten_data_files_count")[0].as_py() > 0
    assert _snapshot(t).summary.operation.value == "replace"
    reference.sql(warehouse, "CALL system.expire_snapshots(table => 'shop.orders', retain_last => 1, older_than => TIMESTAMP '2999-01-01 00:00:00')")
    _snapshot(t)
    assert len(t.iceberg.metadata.snapshots) == 1
    want = rows(pa.Table.from_pylist(list(expected.values()), schema=TYPED))
    assert rows(reference.read(warehouse, "shop.orders").cast(TYPED)) == want
    # The procedure refuses intervals under a day; with one, every file here is too young to be an orphan.
    cutoff = (dt.datetime.now(UTC) - dt.timedelta(days=2)).strftime("%Y-%m-%d %H:%M:%S")
    orphans = reference.sql(
        warehouse, f"CALL system.remove_orphan_files(table => 'shop.orders', older_than => TIMESTAMP '{cutoff}', dry_run => true)"
    )
    assert orphans.column_names == ["orphan_file_location"] and orphans.num_rows == 0
    reference.forget(warehouse)


def test_flink_commit_with_equality_and_position_deletes(reference, warehouse):
    """A Flink upsert checkpoint through the Java API: equality deletes on the key, a position delete for a row
    written and deleted in the same checkpoint; pyiceberg sees the snapshot and its files, Spark the rows."""
    t = _typed_table(warehouse, ["bucket(2, id)"], name="shop.orders")
    t.append(_batch([1, 2, 3]))
    before = _snapshot(t)
    commit = reference.flink_commit(
        warehouse,
        "shop.orders",
        [
            ("+I", _row(1, variant=1)),  # upsert of a live key: equality delete + new image
            ("-D", {"id": 2}),  # delete of a live key: equality delete
            ("+I", _row(10)),  # a new key ...
            ("+I", _row(11)),
            ("-D", {"id": 11}),  # ... written and deleted in this checkpoint: a position delete
        ],
        upsert=True,
    )
    snap = _snapshot(t)
    assert snap.snapshot_id == commit.snapshot_id and snap.parent_snapshot_id == before.snapshot_id
    assert snap.sequence_number == before.sequence_number + 1 == commit.sequence_number
    assert snap.summary.operation.value == "overwrite"
    props = snap.summary.additional_properties
    assert props["flink.max-committed-checkpoint-id"] == "1" and "flink.job-id" in props
    # equality deletes: key 1, 2 and (upsert) 10, 11 -- 11 was then position-deleted
    assert props["added-equality-deletes"] == "4" and props["added-position-deletes"] == "1"

    id_field = t.iceberg.schema().find_field("id").field_id
    contents: dict[DataFileContent, list] = {}
    for manifest in snap.manifests(t.iceberg.io):
        if manifest.added_snapshot_id != snap.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(t.iceberg.io, discard_deleted=True):
            contents.setdefault(entry.data_file.content, []).append(entry.data_file)
    eq = contents[DataFileContent.EQUALITY_DELETES]
    assert all(f.equality_ids == [id_field] for f in eq)
    assert sorted(f.file_path for f in eq) == sorted(commit.equality_delete_files)
    (pos_file,) = contents[DataFileContent.POSITION_DELETES]
    (pos,) = pq.read_table(pos_file.file_path).to_pylist()
    assert pos["file_path"] in commit.data_files  # points into this commit's own data file

    want = rows(pa.Table.from_pylist([_row(1, 1), _row(3), _row(10)], schema=TYPED))
    assert rows(reference.read(warehouse, "shop.orders").cast(TYPED)) == want

    # Non-upsert mode: -U/+U pairs and a full-row delete; equality deletes hold whole rows.
    second = reference.flink_commit(
        warehouse, "shop.orders", [("-U", _row(3)), ("+U", _row(3, variant=2)), ("-D", _row(10))], upsert=False
    )
    assert second.sequence_number == commit.sequence_number + 1
    assert _snapshot(t).summary.additional_properties["flink.max-committed-checkpoint-id"] == "2"
    assert second.equality_delete_files and not second.position_delete_files
    for eq_file in second.equality_delete_files:
        assert pq.read_schema(eq_file).names == TYPED.names  # full rows, equality on the key
    want = rows(pa.Table.from_pylist([_row(1, 1), _row(3, 2)], schema=TYPED))
    assert rows(reference.read(warehouse, "shop.orders").cast(TYPED)) == want
    reference.forget(warehouse)


def test_java_api_writes_keep_iceberg_types(reference, warehouse):
    """Values cross into the Java API by the Iceberg schema: a small long stays a long (py4j would make it an
    int), dates, both timestamps, decimals and booleans keep their types; Spark reads back the same values."""
    t = _typed_table(warehouse, None)
    t.append(_batch([1]))
    big = 2**40 + 5  # longs on both sides of 2**31: py4j alone would send the small ones as java Integers
    rows_in = [_row(2), _row(3), {**_row(5), "id": big, "qty": None, "price": None, "ts": None, "ok": None}]
    commit = reference.row_delta(warehouse, "shop.typed", upserts=rows_in, deletes=[{"id": 1}])
    (data_file,) = commit.data_files
    physical = pq.read_schema(data_file)
    assert physical.field("id").type == pa.int64() and physical.field("qty").type == pa.int32()
    assert physical.field("price").type == pa.decimal128(10, 2) and physical.field("d").type == pa.date32()
    assert _same_type(physical.field("ts").type, pa.timestamp("us", tz="UTC"))
    assert physical.field("local_ts").type == pa.timestamp("us")
    theirs = reference.read(warehouse, "shop.typed")
    for a, b in zip(theirs.schema, TYPED, strict=True):
        assert _same_type(a.type, b.type), f"{a.name}: {a.type} vs {b.type}"
    assert rows(theirs.cast(TYPED)) == rows(pa.Table.from_pylist(rows_in, schema=TYPED))
    reference.forget(warehouse)


def test_spark_and_pyiceberg_agree_on_custom_data_and_metadata_paths(reference, warehouse):
    """write.data.path / write.metadata.path: both engines write where the table says, as plain absolute
    paths, and each reads the other's files."""
    data_dir = os.path.join(warehouse, "elsewhere", "data")
    meta_dir = os.path.join(warehouse, "elsewhere", "meta")
    t = lineage.create_table(
        "shop.paths", TYPED, key=["id"], warehouse=warehouse,
        properties={"write.data.path": data_dir, "write.metadata.path": meta_dir},
    )
    t.append(_batch([1, 2]))
    t.delete("id = 2")
    reference.append(warehouse, "shop.paths", _batch([3]))
    t.refresh()
    assert t.iceberg.metadata_location.startswith(meta_dir + os.sep)
    files = reference.sql(warehouse, "SELECT file_path FROM shop.paths.all_files").column("file_path").to_pylist()
    assert files and all(f.startswith(data_dir + os.sep) for f in files), files
    manifests = reference.sql(warehouse, "SELECT path FROM shop.paths.all_manifests").column("path").to_pylist()
    assert manifests and all(m.startswith(meta_dir + os.sep) for m in manifests), manifests
    meta = reference.metadata(warehouse, "shop.paths")
    assert meta["metadata_location"] == t.iceberg.metadata_location
    assert meta["location"] == t.iceberg.metadata.location  # no scheme added by either side
    want = rows(_batch([1, 3]))
    assert rows(reference.read(warehouse, "shop.paths").cast(TYPED)) == want
    assert rows(t.iceberg.scan().to_arrow().cast(TYPED)) == want
    reference.forget(warehouse)


def test_iceberg_orphan_removal_keeps_lineage_metadata(reference, warehouse):
    """Iceberg's DeleteOrphanFiles (dry run) must not count the files our lineage metadata needs as orphans.

    They live in hidden folders (metadata/_lineage, metadata/_index), which Iceberg's listing skips; an
    ordinary orphan (an unreferenced Parquet file in data/) is still found, so the check is not vacuous.
    """
    t = _typed_table(warehouse, None)
    t.append(_batch([1, 2, 3]))
    t.delete("id = 2")  # writes a deleted-rows index file
    t.refresh()
    needed = [p for p in _files_under(t.iceberg.metadata.location) if "/metadata/_lineage/" in p or "/metadata/_index/" in p]
    assert any(p.endswith("-list.json") for p in needed) and any(p.endswith("-deleted-rows.parquet") for p in needed), needed
    stray = os.path.join(t.iceberg.metadata.location, "data", "stray.parquet")
    pq.write_table(pa.table({"x": [1]}), stray)
    os.utime(stray, (0, 0))
    orphans = {p.removeprefix("file:") for p in reference.remove_orphan_files(warehouse, "shop.typed")}
    reference.forget(warehouse)
    assert stray in orphans, f"the dry run found no orphan at all: {sorted(orphans)}"
    assert not orphans & set(needed), f"Iceberg would delete lineage files: {sorted(orphans & set(needed))}"


def _files_under(root: str) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]


def test_errors_carry_the_engines_message(reference, warehouse):
    """Spark's own error text reaches the test; a malformed request is refused before anything is written."""
    _typed_table(warehouse, None)
    with pytest.raises(SparkError, match="TABLE_OR_VIEW_NOT_FOUND") as info:
        reference.sql(warehouse, "SELECT * FROM shop.missing")
    assert info.value.error_type == "AnalysisException"
    with pytest.raises(ReferenceRequestError, match="unknown event kinds"):
        reference.flink_commit(warehouse, "shop.typed", [("+X", {"id": 1})])
    with pytest.raises(ReferenceRequestError, match="partition|key"):
        reference.flink_commit(warehouse, "shop.typed", [("-D", {"region": "eu"})], upsert=True)
    with pytest.raises(ReferenceRequestError, match="not a folder"):
        reference.read(os.path.join(warehouse, "nope"), "shop.typed")
    reference.forget(warehouse)
