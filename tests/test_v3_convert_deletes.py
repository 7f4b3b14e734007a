"""CONVERT on Iceberg v3 tables: equality deletes become deletion vectors, and no reader's answer changes.

The reference engine (Spark 3.5 + Iceberg 1.10) commits Flink-style equality deletes through Iceberg's Java
API on a v3 table (``tests/reference/javawrites.py``; deletes of a batch's own rows are deletion vectors
there). After CONVERT: no equality delete file and no position delete file is live, every live delete is a
Puffin deletion vector, at most one per data file; Spark, DuckDB's ``iceberg_scan``, pyiceberg and our scan
return the same rows, ``_row_id`` and ``_last_updated_sequence_number`` as before; the deleted-rows index and
the change feed are unchanged (CONVERT is no change).
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from conftest import rows
from pyiceberg.manifest import DataFileContent, FileFormat
from test_iceberg_v3_write import SCHEMA, _batch, duckdb_native, ours

import cdf
import lineage
import lineage.storage.manifests_v3 as manifests_v3
from lineage.iceberg.planning import live_entries, sequence_of
from lineage.maintenance import convert_vectors, verify

pytestmark = pytest.mark.reference

NAME = "shop.items"
MOR = {p: "merge-on-read" for p in ("write.delete.mode", "write.update.mode", "write.merge.mode")}
FEED = ["_change_type", "_commit_version", "_row_id", "_row_created_at_version", "_row_last_updated_at_version", "id", "name", "qty"]


def spark_rows(reference, warehouse: str, name: str = NAME) -> list[tuple]:
    """Every column and Spark's native lineage, as Spark + Iceberg 1.10 read the table."""
    got = reference.sql(warehouse, f"SELECT *, _row_id, _last_updated_sequence_number FROM {name}")
    return rows(got)


def our_rows(t: lineage.Table) -> list[tuple]:
    """Our scan in the shape of :func:`spark_rows`."""
    got = t.scan(columns=["id", "name", "qty", "_row_id", "_row_last_updated_at_version"])
    return rows(got, ["id", "name", "qty", "_row_id", "_row_last_updated_at_version"])


def pyiceberg_rows(t: lineage.Table) -> list[tuple]:
    return rows(t.iceberg.scan().to_arrow(), ["id", "name", "qty"])


def live_deletes(t: lineage.Table) -> list:
    """The live delete entries of the head snapshot."""
    t.refresh()
    snap = t.iceberg.metadata.current_snapshot()
    return [e for e in live_entries(t.iceberg, snap.manifests(t.iceberg.io)) if e.data_file.content != DataFileContent.DATA]


def assert_only_vectors(t: lineage.Table) -> list:
    """Every live delete is a Puffin deletion vector naming its data file, at most one per data file."""
    entries = live_deletes(t)
    for e in entries:
        f = e.data_file
        assert f.content == DataFileContent.POSITION_DELETES, f"a live {f.content.name} file: {f.file_path}"
        assert f.file_format == FileFormat.PUFFIN and manifests_v3.is_deletion_vector(f), f"not a deletion vector: {f.file_path}"
        assert manifests_v3.referenced_data_file(f) is not None
    targets = [manifests_v3.referenced_data_file(e.data_file) for e in entries]
    assert len(targets) == len(set(targets)), "two deletion vectors for one data file"
    return entries


def feeds(t: lineage.Table) -> dict[tuple[int, int, bool], list[tuple]]:
    """The feed over every range of versions, per version and net."""
    v = t.version
    return {(a, b, net): rows(cdf.changes(t, a, b, net=net), FEED) for a in range(v) for b in range(a + 1, v + 1) for net in (False, True)}


def deleted(t: lineage.Table) -> list[tuple]:
    return rows(cdf.deleted_rows(t, 0), ["_row_id", "_row_deleted_at_version", "id"])


def _table(warehouse: str, partition_by: list[str] | None = None) -> lineage.Table:
    t = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=warehouse, partition_by=partition_by, format_version=3, properties=MOR)
    t.append(_batch([1, 2, 3, 4, 5, 6]))
    t.append(_batch([7, 8, 9]))
    t.delete("id IN (4, 8)")  # deletion vectors of ours that CONVERT must merge
    return t


def _flink(reference, warehouse: str) -> None:
    """Two Flink checkpoints: upsert mode (key-only equality deletes, a deletion vector for a row of the batch)
    and full-row mode."""
    reference.flink_commit(
        warehouse, NAME,
        [("+I", {"id": 1, "name": "x", "qty": 9}), ("-D", {"id": 2}), ("+I", {"id": 10, "name": "t", "qty": 1}),
         ("+I", {"id": 11, "name": "e", "qty": 1}), ("-D", {"id": 11}), ("+I", {"id": 7, "name": "s", "qty": 7})],
        upsert=True,
    )
    reference.flink_commit(warehouse, NAME, [("-U", {"id": 3, "name": "n3", "qty": 1}), ("+U", {"id": 3, "name": "z", "qty": 5}),
                                             ("-D", {"id": 9, "name": "n9", "qty": 1})])


@pytest.mark.parametrize("partition_by", [None, ["bucket(2, id)"]])
def test_convert_on_v3_writes_deletion_vectors_and_changes_no_answer(reference, warehouse, partition_by):
    t = _table(warehouse, partition_by)
    _flink(reference, warehouse)
    t.refresh()
    kinds = {e.data_file.content for e in live_deletes(t)}
    assert DataFileContent.EQUALITY_DELETES in kinds
    spark_before = spark_rows(reference, warehouse)
    ours_before = our_rows(t)
    assert [r[:3] + r[3:] for r in spark_before] == ours_before  # ours reads Flink's commits through native lineage
    native_before = ours(t)
    assert duckdb_native(t) == native_before
    feeds_before, deleted_before = feeds(t), deleted(t)
    history_before = [(c.version, c.operation, c.inserted, c.updated, c.deleted) for c in t.history()]
    v = t.version
    eq_files = [e for e in live_deletes(t) if e.data_file.content == DataFileContent.EQUALITY_DELETES]

    result = t.convert_equality_deletes()
    assert result.version == v + 1 and result.equality_files == len(eq_files) >= 2  # one per checkpoint and partition
    assert result.position_files == 0 and result.deletion_vectors == result.data_files >= 1
    assert result.positions == 5  # keys 1, 2, 3 (the first append's file), 7 and 9 (the second's)
    assert "deletion vector" in result.detail
    snap = t.iceberg.metadata.current_snapshot()
    assert snap.summary.operation.value == "replace"
    entries = assert_only_vectors(t)
    mine = [e for e in entries if e.snapshot_id == snap.snapshot_id]
    assert len(mine) == result.deletion_vectors
    assert len({e.data_file.file_path for e in mine}) == 1  # the vectors of one commit share a Puffin file
    assert {sequence_of(e) for e in mine} == {snap.sequence_number}  # they inherit the commit's sequence number

    # Every reader: the same rows, row ids and sequence numbers as before.
    assert spark_rows(reference, warehouse) == spark_before
    assert our_rows(t) == ours_before
    assert duckdb_native(t) == native_before
    assert pyiceberg_rows(t) == rows(t.scan(with_lineage=False), ["id", "name", "qty"])
    # CONVERT is no change: the feed over any range (through it too), the deleted-rows index, the history counts.
    assert [(c.version, c.operation, c.inserted, c.updated, c.deleted) for c in t.history()] == history_before + [
        (v + 1, "convert-deletes", 0, 0, 0)
    ]
    for (a, b, net), expected in feeds_before.items():
        assert rows(cdf.changes(t, a, b, net=net), FEED) == expected, (a, b, net)
        if b == v:
            assert rows(cdf.changes(t, a, v + 1, net=net), FEED) == expected, (a, "through CONVERT", net)
    assert rows(cdf.changes(t, v, v + 1), FEED) == []
    assert deleted(t) == deleted_before
    assert verify(t).ok, verify(t).problems
    assert t.convert_equality_deletes().version is None

    # Writers after CONVERT: Spark merges our vectors into its own, and we merge Spark's.
    reference.sql(warehouse, f"DELETE FROM {NAME} WHERE id IN (5, 6)")
    t.refresh()
    t.delete("id = 10")
    assert_only_vectors(t)
    assert spark_rows(reference, warehouse) == [r for r in spark_before if r[0] not in (5, 6, 10)]
    assert our_rows(t) == [r for r in ours_before if r[0] not in (5, 6, 10)]
    reference.forget(warehouse)


def test_flink_updates_on_v3_get_new_row_ids_and_convert_keeps_them(reference, warehouse):
    """An equality writer's update is a delete by key plus an insert: the new image has a fresh native id.

    CONVERT writes no data file, so every id any reader returned stays; the feed records what the ids say.
    """
    t = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=warehouse, format_version=3)
    t.append(_batch([1, 2, 3]))
    next_id = t.iceberg.metadata.next_row_id
    reference.flink_commit(warehouse, NAME, [("+I", {"id": 1, "name": "x", "qty": 9})], upsert=True)
    t.refresh()
    native = {r[0]: r[1:] for r in ours(t)}
    assert native[1] == (next_id, t.version)  # a fresh id: the new file's first_row_id, not the old row's 0
    assert {k: native[k] for k in (2, 3)} == {2: (1, 1), 3: (2, 1)}
    feed = rows(cdf.changes(t, 1, t.version), ["id", "_change_type", "_row_id"])
    assert feed == [(1, "delete", 0), (1, "insert", next_id)]
    t.convert_equality_deletes()
    assert {r[0]: r[1:] for r in ours(t)} == native == {r[0]: r[1:] for r in duckdb_native(t)}
    reference.forget(warehouse)


def test_a_commit_between_plan_and_commit_makes_convert_retry(reference, warehouse, monkeypatch):
    """Another writer commits new equality deletes (and a deletion vector) while CONVERT writes its vectors:
    CONVERT loses the race, plans again on the new head and converts those too."""
    t = _table(warehouse)
    _flink(reference, warehouse)
    t.refresh()
    real = convert_vectors.write_vectors
    calls: list[int] = []

    def write_and_race(ice, targets):  # type: ignore[no-untyped-def]
        if not calls:
            reference.flink_commit(warehouse, NAME, [("+I", {"id": 5, "name": "r", "qty": 2}), ("-D", {"id": 6}),
                                                     ("+I", {"id": 12, "name": "q", "qty": 1}), ("-D", {"id": 12})], upsert=True)
        calls.append(1)
        return real(ice, targets)

    monkeypatch.setattr(convert_vectors, "write_vectors", write_and_race)
    result = t.convert_equality_deletes()
    assert result.attempts == 2 and result.equality_files == 3 and len(calls) == 2
    assert_only_vectors(t)
    expected = spark_rows(reference, warehouse)
    assert {r[0] for r in expected} == {1, 3, 5, 7, 10}
    assert our_rows(t) == expected
    assert verify(t).ok, verify(t).problems
    reference.forget(warehouse)


def _spark_v3_table(reference, tmp_path, n: int, properties: str = "") -> str:
    """A warehouse with Spark's plain v3 table db.t (id, name, qty) holding ids 0 .. n - 1."""
    warehouse = str(tmp_path / "wh")
    os.makedirs(warehouse)
    reference.sql(warehouse, "CREATE NAMESPACE IF NOT EXISTS db")
    reference.sql(warehouse, "CREATE TABLE db.t (id bigint NOT NULL, name string, qty bigint) USING iceberg "
                             f"TBLPROPERTIES ('format-version'='3'{properties})")
    reference.sql(warehouse, f"INSERT INTO db.t SELECT id, concat('n', id), 1 FROM range(0, {n})")
    return warehouse


def test_adoption_of_a_plain_v3_table_converts_to_deletion_vectors(reference, tmp_path):
    """A plain v3 table (Spark's) with Flink's equality deletes: adoption converts them to deletion vectors
    first, merging Spark's own vectors, and keeps every native row id."""
    warehouse = _spark_v3_table(reference, tmp_path, 20, ", 'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read'")
    reference.sql(warehouse, "DELETE FROM db.t WHERE id IN (3, 4)")  # Spark's deletion vector
    reference.flink_commit(warehouse, "db.t", [("+I", {"id": 1, "name": "x", "qty": 9}), ("-D", {"id": 2}), ("-D", {"id": 5})],
                           key=["id"], upsert=True)
    before = spark_rows(reference, warehouse, "db.t")
    adoption = lineage.adopt("db.t", key=["id"], warehouse=warehouse)
    assert adoption.converted == 1
    t = lineage.open_table("db.t", warehouse=warehouse)
    assert_only_vectors(t)
    assert spark_rows(reference, warehouse, "db.t") == before
    assert our_rows(t) == before
    assert pyiceberg_rows(t) == [r[:3] for r in before]
    reference.forget(warehouse)


def test_upgrade_of_a_v2_table_with_flink_equality_deletes(reference, warehouse):
    """The upgrade converts Flink's equality deletes first; Spark then reads our row ids, and later Flink
    checkpoints on the v3 table are converted to deletion vectors."""
    from test_iceberg_v3_write import spark_native

    t = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=warehouse, properties=MOR)
    t.append(_batch([1, 2, 3, 4, 5, 6]))
    t.append(_batch([7, 8, 9]))
    t.delete("id IN (4, 8)")
    _flink(reference, warehouse)
    t.refresh()
    before, feed = our_rows(t), rows(cdf.changes(t, 0), FEED)
    result = t.upgrade()
    assert "equality delete file(s) converted" in result.detail and t.iceberg.metadata.format_version == 3
    assert spark_rows(reference, warehouse) == our_rows(t) == before
    assert spark_native(reference, warehouse, t) == ours(t) == duckdb_native(t)
    assert rows(cdf.changes(t, 0), FEED) == feed
    reference.flink_commit(warehouse, NAME, [("+I", {"id": 5, "name": "r", "qty": 2}), ("-D", {"id": 6})], upsert=True)
    t.refresh()
    expected = spark_rows(reference, warehouse)
    assert t.convert_equality_deletes().deletion_vectors >= 1
    assert not [e for e in live_deletes(t) if e.data_file.content == DataFileContent.EQUALITY_DELETES]
    assert spark_rows(reference, warehouse) == our_rows(t) == expected
    reference.forget(warehouse)


def test_an_equality_delete_on_a_column_the_table_lacks_is_refused_and_nothing_changes(reference, tmp_path):
    from lineage.catalog import resolve_catalog
    from lineage.errors import LineageMetadataError
    from lineage.maintenance.convert import convert_equality_deletes

    warehouse = _spark_v3_table(reference, tmp_path, 5)
    reference.flink_commit(warehouse, "db.t", [("-D", {"id": 3, "name": "n3", "qty": 1})], key=["name"])
    reference.sql(warehouse, "ALTER TABLE db.t DROP COLUMN name")  # the equality deletes' column is gone
    ice = resolve_catalog(warehouse, None).load_table("db.t")
    location = ice.metadata_location
    with pytest.raises(LineageMetadataError, match="names a column the schema lacks"):
        convert_equality_deletes(ice, ice.refresh, "db.t")
    with pytest.raises(LineageMetadataError, match="names a column the schema lacks"):
        lineage.adopt("db.t", key=["id"], warehouse=warehouse)
    assert ice.refresh().metadata_location == location
    reference.forget(warehouse)


def test_convert_deletes_command_on_v3(reference, warehouse):
    """``lineage convert-deletes`` reports the deletion vectors it wrote; a second run finds nothing to do."""
    import json

    from test_cli import ok, run

    t = _table(warehouse)
    _flink(reference, warehouse)
    done = json.loads(ok(run("--warehouse", warehouse, "-f", "json", "convert-deletes", NAME)).stdout)
    assert done["committed"] and done["files_added"] == 1  # one Puffin file holding both vectors
    assert "-> 2 deletion vector(s) (5 positions in 2 data file(s))" in done["detail"]
    assert_only_vectors(t)
    again = ok(run("--warehouse", warehouse, "convert-deletes", NAME)).stdout
    assert "no equality delete files" in again
    reference.forget(warehouse)
