"""Iceberg format version 3 written by this library: metadata, manifests, data files, and what other readers see.

Every v3 reader must return our ``_row_id`` for every row: DuckDB's iceberg
extension and the reference engine (Spark 3.5 + Iceberg 1.10) read the native
``_row_id`` / ``_last_updated_sequence_number``; pyiceberg reads the rows.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest
from conftest import rows
from pyiceberg.avro.file import AvroFile
from pyiceberg.manifest import MANIFEST_LIST_FILE_SCHEMAS, ManifestFile

import cdf
import lineage
import lineage.duck as duck
from lineage.errors import InvalidArgumentError, UnsupportedFormatError
from lineage.storage import manifests_v3
from lineage.storage.deletes import read_position_deletes

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("qty", pa.int64())])


def _batch(ids: list[int], qty: int = 1) -> pa.Table:
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids], "qty": [qty] * len(ids)}, schema=SCHEMA)


MODES = ["merge-on-read", "copy-on-write"]


def _v3(warehouse: str, name: str = "shop.items", mode: str | None = None) -> lineage.Table:
    props = {p: mode for p in ("write.delete.mode", "write.update.mode", "write.merge.mode")} if mode else None
    return lineage.create_table(name, SCHEMA, key=["id"], warehouse=warehouse, format_version=3, properties=props)


def _metadata_json(t: lineage.Table) -> dict:
    t.refresh()
    with open(t.iceberg.metadata_location.removeprefix("file://")) as f:
        return json.load(f)


def ours(t: lineage.Table) -> list[tuple]:
    """(id, _row_id, _last_updated_sequence_number) of our scan: our updated version is the commit's sequence number."""
    s = t.scan()
    return rows(s, ["id", "_row_id", "_row_last_updated_at_version"])


def duckdb_native(t: lineage.Table) -> list[tuple]:
    """(id, _row_id, _last_updated_sequence_number) as DuckDB's iceberg extension reads them."""
    t.refresh()
    con = duck.connect("iceberg")
    try:
        got = con.execute(
            f"SELECT id, _row_id, _last_updated_sequence_number FROM iceberg_scan('{t.iceberg.metadata_location}')"
        ).to_arrow_table()
    finally:
        con.close()
    return rows(got.rename_columns(["id", "_row_id", "_row_last_updated_at_version"]))


def assert_readers_agree(t: lineage.Table) -> list[tuple]:
    """DuckDB's native lineage equals our scan's, and pyiceberg reads the same rows; returns our rows."""
    mine = ours(t)
    assert duckdb_native(t) == mine
    assert rows(t.iceberg.scan().to_arrow(), ["id", "name", "qty"]) == rows(t.scan(with_lineage=False), ["id", "name", "qty"])
    assert t.iceberg.metadata.next_row_id == t.state().lineage.next_row_id  # our next row id is the table's next-row-id
    return mine


# ---------------------------------------------------------------------- metadata and manifests


def test_create_table_format_version_3_writes_spec_metadata(warehouse):
    t = _v3(warehouse)
    obj = _metadata_json(t)
    assert obj["format-version"] == 3 and obj["next-row-id"] == 0
    t.append(_batch([1, 2, 3]))
    t.append(_batch([4, 5]))
    obj = _metadata_json(t)
    assert obj["format-version"] == 3
    assert obj["next-row-id"] == 5
    snaps = obj["snapshots"]
    assert [(s["first-row-id"], s["added-rows"]) for s in snaps] == [(0, 3), (3, 2)]
    assert t.properties["write.delete.mode"] == "merge-on-read"

    # the manifest list carries first_row_id (field 520) and says format-version 3; so do the manifests
    io = t.iceberg.io
    last = t.iceberg.metadata.current_snapshot()
    with AvroFile[ManifestFile](io.new_input(last.manifest_list), MANIFEST_LIST_FILE_SCHEMAS[3], read_types={-1: ManifestFile}) as r:
        assert r.header.meta["format-version"] == "3" and r.header.meta["first-row-id"] == "3"
        listed = list(r)
    assert sorted(manifests_v3.manifest_first_row_id(m) for m in listed) == [0, 3]
    for m in listed:
        with AvroFile(io.new_input(m.manifest_path)) as r:
            assert r.header.meta["format-version"] == "3"
        entries = manifests_v3.read_entries(m, io)
        assert [manifests_v3.first_row_id(e.data_file) for e in entries] == [manifests_v3.manifest_first_row_id(m)]


def test_format_version_is_checked(warehouse):
    with pytest.raises(InvalidArgumentError, match="format-version must be 2 or 3"):
        lineage.create_table("shop.bad", SCHEMA, warehouse=warehouse, format_version=4)
    with pytest.raises(InvalidArgumentError, match="format-version must be 2 or 3"):
        lineage.create_table("shop.bad", SCHEMA, warehouse=warehouse, properties={"format-version": "1"})
    assert _metadata_json(lineage.create_table("shop.v2", SCHEMA, warehouse=warehouse))["format-version"] == 2
    t = lineage.create_table("shop.p", SCHEMA, warehouse=warehouse, properties={"format-version": "3"})
    assert _metadata_json(t)["format-version"] == 3


def test_v3_refuses_position_delete_files_and_leaves_the_table_untouched(warehouse):
    from lineage.storage.writer import write_position_deletes

    t = _v3(warehouse)
    t.append(_batch([1, 2, 3]))
    before = t.refresh().version
    (f,) = t.state().live_files()
    with pytest.raises(UnsupportedFormatError, match="deletion vectors"):
        write_position_deletes(t.iceberg, [(f.data_file, np.array([1]))])
    assert t.refresh().version == before
    assert rows(t.scan(with_lineage=False), ["id"]) == [(1,), (2,), (3,)]


def test_deletes_are_one_deletion_vector_per_data_file(warehouse):
    t = _v3(warehouse)
    t.append(_batch(list(range(10))))
    t.delete("id IN (1, 2)")
    t.delete("id = 5")
    t.update("id = 7", {"qty": "70"})
    (f,) = [f for f in t.state().live_files() if f.data_file.record_count == 10]
    assert len(f.deletes) == 1 and f.deletes[0].file_path.endswith(".puffin")
    assert sorted(read_position_deletes(f.deletes[0].file_path)[f.path]) == [1, 2, 5, 7]
    # the manifests carry the vector's v3 fields
    (entry,) = [e for m in manifests_v3.read_manifest_list(t.iceberg.io, t.iceberg.metadata.current_snapshot().manifest_list)
                if m.content == 1 for e in manifests_v3.read_entries(m, t.iceberg.io)]
    assert manifests_v3.is_deletion_vector(entry.data_file)
    assert manifests_v3.referenced_data_file(entry.data_file) == f.path and entry.data_file.record_count == 4
    assert manifests_v3.content_range(entry.data_file) is not None
    assert_readers_agree(t)


# ---------------------------------------------------------------------- native row ids equal ours


def test_appends_native_row_ids_equal_ours(warehouse):
    t = _v3(warehouse)
    t.append(_batch([1, 2, 3]))
    t.append(_batch([10, 11]))
    t.append(_batch(list(range(100, 150))))
    got = assert_readers_agree(t)
    assert sorted(r[1] for r in got) == list(range(55))
    assert t.refresh().iceberg.metadata.next_row_id == 55


@pytest.mark.parametrize("mode", MODES)
def test_updates_deletes_upserts_keep_native_row_ids(warehouse, mode):
    t = _v3(warehouse, mode=mode)
    t.append(_batch(list(range(20))))
    t.append(_batch(list(range(20, 30))))
    ids_before = {r[0]: r[1] for r in ours(t)}
    t.update("id < 5", {"qty": "qty + 5"})
    assert_readers_agree(t)
    t.delete("id IN (7, 25)")
    assert_readers_agree(t)
    t.upsert(pa.concat_tables([_batch([1, 2], qty=9), _batch([40, 41], qty=4)]))
    got = assert_readers_agree(t)
    after = {r[0]: r[1] for r in got}
    # every surviving row keeps its id; the upserted new keys get fresh ones above all ids in use
    assert all(after[k] == v for k, v in ids_before.items() if k in after)
    assert min(after[40], after[41]) >= 30
    # updated rows carry the sequence number of the commit that updated them
    seq = {r[0]: r[2] for r in got}
    assert seq[1] == seq[2] == t.version and seq[3] == 3 and seq[10] == 1


@pytest.mark.parametrize("mode", MODES)
def test_compaction_keeps_native_row_ids_and_sequence_numbers(warehouse, mode):
    t = _v3(warehouse, mode=mode)
    for i in range(4):
        t.append(_batch(list(range(i * 10, i * 10 + 10))))
    t.update("id = 3", {"qty": "7"})
    before = ours(t)
    t.compact()
    assert assert_readers_agree(t) == before


def _events(*evs: tuple[str, int, int]) -> pa.Table:
    return pa.table({"_op": [e[0] for e in evs], "id": [e[1] for e in evs], "name": [f"n{e[1]}" for e in evs], "qty": [e[2] for e in evs]})


@pytest.mark.parametrize("mode", MODES)
def test_merge_changelog_purge_keep_native_row_ids_and_the_feed(warehouse, mode):
    t = _v3(warehouse, mode=mode)
    t.append(_batch(list(range(10))))
    rid = {r[0]: r[1] for r in ours(t)}
    t.merge(upserts=_batch([1, 11], qty=3), deletes=pa.table({"id": [2]}))
    assert_readers_agree(t)
    v_merge = t.version
    t.apply_changelog(_events(("-U", 3, 1), ("+U", 3, 30), ("+I", 12, 1), ("-D", 4, 1)))
    assert_readers_agree(t)
    t.purge("id = 5")
    got = assert_readers_agree(t)
    now = {r[0]: r[1] for r in got}
    assert all(now[k] == rid[k] for k in (0, 1, 3, 6, 7, 8, 9))
    assert 2 not in now and 4 not in now and 5 not in now and now[11] >= 10 and now[12] >= 10
    # the change feed pairs the merge's and the changelog's images by row id
    feed = cdf.changes(t, v_merge - 1, v_merge + 1).to_pylist()
    kinds = sorted((r["_change_type"], r["id"], r["_row_id"]) for r in feed)
    assert kinds == sorted([
        ("update_preimage", 1, rid[1]), ("update_postimage", 1, rid[1]), ("insert", 11, now[11]), ("delete", 2, rid[2]),
        ("update_preimage", 3, rid[3]), ("update_postimage", 3, rid[3]), ("insert", 12, now[12]), ("delete", 4, rid[4]),
    ])


# ---------------------------------------------------------------------- the reference engine (Spark 3.5 + Iceberg 1.10)


def spark_native(reference, warehouse: str, t: lineage.Table) -> list[tuple]:
    got = reference.sql(warehouse, f"SELECT id, _row_id, _last_updated_sequence_number FROM {t.name}")
    return rows(got.rename_columns(["id", "_row_id", "_row_last_updated_at_version"]))


@pytest.mark.reference
@pytest.mark.parametrize("mode", MODES)
def test_spark_reads_our_row_ids_and_continues_them(reference, warehouse, mode):
    t = _v3(warehouse, mode=mode)
    t.append(_batch(list(range(20))))
    t.append(_batch(list(range(20, 30))))
    assert spark_native(reference, warehouse, t) == assert_readers_agree(t)
    t.update("id < 5", {"qty": "qty + 5"})
    t.delete("id IN (7, 25)")
    t.upsert(pa.concat_tables([_batch([1, 2], qty=9), _batch([40, 41], qty=4)]))
    assert spark_native(reference, warehouse, t) == assert_readers_agree(t)
    t.compact()
    mine = assert_readers_agree(t)
    assert spark_native(reference, warehouse, t) == mine
    assert {r[0]: r[1] for r in ours(t)} == {r[0]: r[1] for r in mine}

    # Spark appends: its row ids continue the table's next-row-id, after every id we assigned
    next_id = t.refresh().iceberg.metadata.next_row_id
    reference.sql(warehouse, f"INSERT INTO {t.name} VALUES (500, 'x', 1), (501, 'y', 2)")
    theirs = dict((r[0], r[1]) for r in spark_native(reference, warehouse, t))
    assert sorted([theirs[500], theirs[501]]) == [next_id, next_id + 1]
    assert all(theirs[k] == v for k, v in {r[0]: r[1] for r in mine}.items())
    meta = _metadata_json(t)
    assert meta["format-version"] == 3 and meta["next-row-id"] == next_id + 2
    reference.forget(warehouse)


def test_a_rewritten_file_takes_its_vector_along(warehouse):
    t = _v3(warehouse)
    t.append(_batch(list(range(10))))
    t.delete("id = 3")
    vector = [d.file_path for f in t.state().live_files() for d in f.deletes]
    t.update("id = 4", {"qty": "9"}, mode="copy-on-write")  # the file leaves; its vector must not stay behind
    entries = [e for m in manifests_v3.read_manifest_list(t.iceberg.io, t.iceberg.metadata.current_snapshot().manifest_list)
               if m.content == 1 for e in manifests_v3.read_entries(m, t.iceberg.io)]
    assert [e.data_file.file_path for e in entries] == []
    assert len(vector) == 1
    t.rewrite_deletes()
    assert_readers_agree(t)


def test_the_equality_changelog_strategy_is_refused_on_v3(warehouse):
    t = lineage.create_table("shop.eq", SCHEMA, key=["id"], warehouse=warehouse, format_version=3,
                             properties={"write.changelog.strategy": "equality"})
    t.append(_batch([1]))
    with pytest.raises(UnsupportedFormatError, match="equality"):
        t.apply_changelog(_events(("+U", 1, 5)), upsert=True)
    assert t.refresh().version == 1


@pytest.mark.reference
def test_our_writes_after_sparks_replace_its_deletion_vectors(reference, warehouse):
    t = _v3(warehouse)
    t.append(_batch(list(range(6))))
    t.delete("id = 1")
    reference.sql(warehouse, f"INSERT INTO {t.name} VALUES (500, 'x', 1), (501, 'y', 2)")
    reference.sql(warehouse, f"UPDATE {t.name} SET qty = 99 WHERE id IN (2, 500)")  # Spark's vectors replace ours
    assert spark_native(reference, warehouse, t) == assert_readers_agree(t.refresh())
    t.update("id IN (3, 501)", {"qty": "7"})  # ours replace Spark's: still one vector per data file
    t.delete("id = 4")
    assert spark_native(reference, warehouse, t) == assert_readers_agree(t)
    reference.sql(warehouse, f"DELETE FROM {t.name} WHERE id = 0")
    t.upsert(_batch([5, 600], qty=3))
    assert spark_native(reference, warehouse, t) == assert_readers_agree(t.refresh())
    reference.forget(warehouse)


def test_writes_run_on_spark_executors_keep_native_row_ids(spark, warehouse):
    """Spark writes of this library (merge-on-read only) on v3: executors write the lineage columns, deletes are vectors."""
    from conftest import assert_interop

    t = _v3(warehouse)
    t.append(spark.createDataFrame(_batch(list(range(8)))))
    before = {r[0]: r[1] for r in ours(t)}
    t.upsert(spark.createDataFrame(_batch([2, 20], qty=5)))
    t.update("id IN (3, 4)", {"qty": "qty * 10"}, engine="spark", spark=spark)
    t.delete("id = 5", engine="spark", spark=spark)
    t.delete("id = 6", engine="spark", spark=spark)  # a second vector of the same file: merged with the first
    assert_interop(t)  # on v3 it checks DuckDB's native _row_id and _last_updated_sequence_number too
    now = assert_readers_agree(t)
    assert all({r[0]: r[1] for r in now}[k] == v for k, v in before.items() if k not in (5, 6))
    assert all(len([d for d in f.deletes]) <= 1 for f in t.state().live_files())  # at most one vector per data file
    v = t.version
    t.compact(engine="spark", spark=spark)
    assert t.refresh().version > v and assert_readers_agree(t) == now
    assert cdf.changes(t, v).num_rows == 0  # compaction makes no change event
    t.purge("id = 7", engine="spark", spark=spark)
    assert_interop(t)
    assert [r for r in assert_readers_agree(t) if r[0] != 7] == [r for r in now if r[0] != 7]


def test_expire_vacuum_and_maintain_keep_the_vectors_in_use(warehouse):
    import datetime as dt

    t = _v3(warehouse)
    for i in range(3):
        t.append(_batch(list(range(i * 10, i * 10 + 10))))
    t.delete("id IN (1, 11)")
    t.delete("id IN (2, 21)")
    t.update("id = 12", {"qty": "5"})
    before = assert_readers_agree(t)
    t.expire_snapshots(retain_last=1)
    t.vacuum(older_than=dt.timedelta(0))
    assert assert_readers_agree(t) == before
    vectors = [d.file_path for f in t.state().live_files() for d in f.deletes]
    assert vectors and all(os.path.exists(p.removeprefix("file://")) for p in vectors)
    v = t.version
    t.maintain()
    t.compact()
    assert t.refresh().version > v
    assert assert_readers_agree(t) == before
    assert cdf.changes(t, v).num_rows == 0  # maintenance makes no change events
