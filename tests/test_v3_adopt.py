"""Adopting Iceberg v3 tables Spark wrote, and Spark's later commits read through their native row lineage.

After adoption every live row keeps the ``_row_id`` every v3 reader returns,
and ``_row_last_updated_at_version`` is its ``_last_updated_sequence_number``.
Spark's later commits (merge-on-read UPDATE, DELETE and MERGE with deletion
vectors, INSERT, ``rewrite_data_files``) are reconciled from their native
lineage: the change feed pairs pre- and post-images by ``_row_id``, also on a
table without a key, and a rewrite changes nothing.
"""

from __future__ import annotations

import os

import pytest

import cdf
import lineage
from lineage.errors import InvalidArgumentError, LineageMetadataError

pytestmark = pytest.mark.reference

MOR = ("'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
       "'write.merge.mode'='merge-on-read'")
NAMES = ["id", "v", "_row_id", "_last_updated_sequence_number"]


def _spark_rows(reference, warehouse: str) -> list[tuple]:
    t = reference.sql(warehouse, "SELECT id, v, _row_id, _last_updated_sequence_number FROM db.t")
    return sorted(zip(*[t.column(n).to_pylist() for n in NAMES], strict=True))


def _our_rows(table: lineage.Table) -> list[tuple]:
    t = table.scan()
    names = ["id", "v", "_row_id", "_row_last_updated_at_version"]
    return sorted(zip(*[t.column(n).to_pylist() for n in names], strict=True))


def _spark_table(reference, tmp_path, name: str = "wh") -> str:
    warehouse = str(tmp_path / name)
    os.makedirs(warehouse)
    reference.sql(warehouse, "CREATE NAMESPACE IF NOT EXISTS db")
    reference.sql(warehouse, f"CREATE TABLE db.t (id bigint, v string) USING iceberg TBLPROPERTIES "
                             f"('format-version'='3', {MOR})")
    reference.sql(warehouse, "INSERT INTO db.t SELECT id, cast(id AS string) FROM range(0, 2000)")
    reference.sql(warehouse, "INSERT INTO db.t SELECT id, cast(id AS string) FROM range(2000, 2500)")
    reference.sql(warehouse, "UPDATE db.t SET v = 'u' WHERE id % 11 = 0")
    reference.sql(warehouse, "DELETE FROM db.t WHERE id % 7 = 0")
    return warehouse


def test_adopt_keeps_native_row_ids_and_reads_spark_commits_natively(reference, tmp_path):
    warehouse = _spark_table(reference, tmp_path)
    before = _spark_rows(reference, warehouse)
    adopted = lineage.adopt("db.t", warehouse=warehouse)
    t = lineage.open_table("db.t", warehouse=warehouse)
    assert _our_rows(t) == before == _spark_rows(reference, warehouse)  # the adoption changed no row or id
    scan = t.scan()
    assert scan.column("_row_created_at_version").to_pylist() == scan.column("_row_last_updated_at_version").to_pylist()
    created = {r["_row_id"]: r["_row_created_at_version"] for r in scan.to_pylist()}

    # Spark goes on writing; each commit is read through its native lineage
    steps = [
        ("UPDATE db.t SET v = 'after' WHERE id % 13 = 0", "update"),
        ("DELETE FROM db.t WHERE id BETWEEN 100 AND 150", "delete"),
        ("MERGE INTO db.t t USING (SELECT id, 'm' AS v FROM range(2400, 2600)) s ON t.id = s.id "
         "WHEN MATCHED THEN UPDATE SET t.v = s.v WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)", "merge"),
        ("CALL lineage.system.rewrite_data_files(table => 'db.t', options => map('rewrite-all', 'true'))", "rewrite"),
    ]
    for statement, kind in steps:
        reference.sql(warehouse, statement)
        t = lineage.open_table("db.t", warehouse=warehouse)
        assert _our_rows(t) == _spark_rows(reference, warehouse), kind
        v = t.version
        feed = cdf.changes(t, from_version=v - 1, to_version=v).to_pylist()
        kinds = sorted({r["_change_type"] for r in feed})
        pre = {r["_row_id"]: r for r in feed if r["_change_type"] == "update_preimage"}
        post = {r["_row_id"]: r for r in feed if r["_change_type"] == "update_postimage"}
        assert set(pre) == set(post), kind  # paired by _row_id, without a key
        assert all(pre[i]["id"] == post[i]["id"] for i in pre), kind
        if kind == "update":
            assert kinds == ["update_postimage", "update_preimage"]
            assert {r["id"] for r in post.values()} == {i for i in range(2500) if i % 13 == 0 and i % 7}
            assert all(post[i]["v"] == "after" and post[i]["_row_created_at_version"] == created[i] for i in post)
        elif kind == "delete":
            assert kinds == ["delete"]
            assert sorted(r["id"] for r in feed) == [i for i in range(100, 151) if i % 7]
        elif kind == "merge":
            assert kinds == ["insert", "update_postimage", "update_preimage"]
            gone = [i for i in range(2400, 2500) if i % 7 == 0]  # deleted before: not matched, inserted again
            assert sorted(r["id"] for r in feed if r["_change_type"] == "insert") == gone + list(range(2500, 2600))
            assert sorted(r["id"] for r in post.values()) == [i for i in range(2400, 2500) if i % 7]
        else:  # a rewrite moves rows unchanged: no change at all
            assert feed == []
    assert adopted.rows >= len(before)


def test_adopt_v3_with_a_key(reference, tmp_path):
    warehouse = _spark_table(reference, tmp_path)
    before = _spark_rows(reference, warehouse)
    adopted = lineage.adopt("db.t", key=["id"], warehouse=warehouse)
    t = adopted.table
    assert adopted.key == ("id",) and _our_rows(t) == before
    t.delete("id = 1 OR id = 2010")  # our own commit on the adopted v3 table: vectors of two files change
    reference.sql(warehouse, "UPDATE db.t SET v = 'x' WHERE id = 2")
    t = lineage.open_table("db.t", warehouse=warehouse)
    assert _our_rows(t) == _spark_rows(reference, warehouse)
    expected = sorted(r[0] for r in before if r[0] not in (1, 2010))  # no other file's deletes were lost
    assert sorted(t.scan().column("id").to_pylist()) == expected


def test_v1_tables_are_still_refused(reference, tmp_path):
    warehouse = str(tmp_path / "wh")
    os.makedirs(warehouse)
    reference.sql(warehouse, "CREATE NAMESPACE IF NOT EXISTS db")
    reference.sql(warehouse, "CREATE TABLE db.t (id bigint) USING iceberg TBLPROPERTIES ('format-version'='1')")
    with pytest.raises(InvalidArgumentError, match="format version 1"):
        lineage.adopt("db.t", warehouse=warehouse)


def test_a_table_upgraded_to_v3_is_adopted_once_a_v3_writer_assigned_row_ids(reference, tmp_path):
    warehouse = str(tmp_path / "wh")
    os.makedirs(warehouse)
    reference.sql(warehouse, "CREATE NAMESPACE IF NOT EXISTS db")
    reference.sql(warehouse, f"CREATE TABLE db.t (id bigint, v string) USING iceberg TBLPROPERTIES ('format-version'='2', {MOR})")
    reference.sql(warehouse, "INSERT INTO db.t SELECT id, cast(id AS string) FROM range(0, 300)")
    reference.sql(warehouse, "DELETE FROM db.t WHERE id % 7 = 0")  # a v2 position delete file
    reference.sql(warehouse, "ALTER TABLE db.t SET TBLPROPERTIES ('format-version'='3')")
    snapshots = len(reference.snapshots(warehouse, "db.t"))
    with pytest.raises(LineageMetadataError, match="before the table was upgraded"):
        lineage.adopt("db.t", warehouse=warehouse)
    assert len(reference.snapshots(warehouse, "db.t")) == snapshots  # refused: untouched
    reference.sql(warehouse, "INSERT INTO db.t SELECT id, cast(id AS string) FROM range(300, 400)")  # assigns row ids
    lineage.adopt("db.t", warehouse=warehouse)
    t = lineage.open_table("db.t", warehouse=warehouse)
    assert _our_rows(t) == _spark_rows(reference, warehouse)
    assert None not in [r[2] for r in _our_rows(t)]
    reference.sql(warehouse, "UPDATE db.t SET v = 'x' WHERE id % 10 = 1")  # a v3 vector over a v2 position delete file
    t = lineage.open_table("db.t", warehouse=warehouse)
    assert _our_rows(t) == _spark_rows(reference, warehouse)


def test_spark_commits_expired_before_we_read_them_reconcile_natively(reference, tmp_path):
    """A gap (Spark committed and expired several snapshots before a read of ours): rows still pair by _row_id."""
    warehouse = _spark_table(reference, tmp_path)
    lineage.adopt("db.t", warehouse=warehouse)
    t = lineage.open_table("db.t", warehouse=warehouse)
    before = {r["_row_id"]: r for r in t.scan().to_pylist()}
    reference.sql(warehouse, "UPDATE db.t SET v = 'g1' WHERE id % 13 = 0")
    reference.sql(warehouse, "DELETE FROM db.t WHERE id BETWEEN 200 AND 260")
    reference.sql(warehouse, "INSERT INTO db.t SELECT id, 'new' FROM range(5000, 5050)")
    reference.sql(warehouse, "CALL lineage.system.rewrite_data_files(table => 'db.t', options => map('rewrite-all', 'true'))")
    reference.sql(warehouse, "CALL lineage.system.expire_snapshots(table => 'db.t', "
                             "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)")
    t = lineage.open_table("db.t", warehouse=warehouse)
    assert _our_rows(t) == _spark_rows(reference, warehouse)
    after = {r["_row_id"]: r for r in t.scan().to_pylist()}
    for rid, row in after.items():
        if rid in before:  # same row: same id, created version kept
            assert row["id"] == before[rid]["id"] and row["_row_created_at_version"] == before[rid]["_row_created_at_version"]
    assert {r["id"] for r in after.values() if r["_row_id"] not in before} == set(range(5000, 5050))
