"""A stream of small commits on a large table keeps few data and delete files, with an exact feed.

Small data files a write does not touch fold into the next small write's file
(``lineage.writes.small_files``), and on Iceberg v2 a data file's position
delete file of ours is replaced by one holding the union at the next delete
from that file (``lineage.storage.merged_deletes``), as a deletion vector is
on v3. Compared with a table where both are off: the same feed and deleted
rows (every column, row ids included), before and after the snapshots holding
the replaced files are expired and vacuumed; foreign readers (pyiceberg,
DuckDB, Spark) read the same rows.
"""

from __future__ import annotations

import datetime as _dt
import os

import numpy as np
import pyarrow as pa
import pytest
from conftest import SCHEMA, assert_interop, rows
from pyiceberg.manifest import DataFile, DataFileContent

import cdf
import lineage
from index import deleted_rows
from lineage.errors import InvalidArgumentError
from lineage.storage.merged_deletes import is_own_file_scoped
from lineage.storage.writer import write_position_deletes

ZERO = _dt.timedelta(0)
OFF = {"lineage.write.delete.merge": "false", "lineage.write.fold.max-rows": "0"}
BASE = 2000


def _base() -> pa.Table:
    return pa.table({"id": list(range(BASE)), "name": [f"r{i}" for i in range(BASE)], "amount": [float(i) for i in range(BASE)]},
                    schema=SCHEMA)


def _stream(tables: list[lineage.Table], commits: int, seed: int = 5) -> None:
    """``commits`` small commits on every table alike: upserts of 5 base keys and 5 new ones, every third a delete."""
    rng = np.random.default_rng(seed)
    next_id = 100_000
    alive = set(range(BASE))
    for c in range(commits):
        if c % 3 == 2:
            gone = [int(k) for k in rng.choice(sorted(alive), 3, replace=False)]
            alive -= set(gone)
            for t in tables:
                t.delete(f"id IN ({', '.join(map(str, gone))})")
            continue
        keys = [int(k) for k in rng.choice(sorted(alive), 5, replace=False)] + list(range(next_id, next_id + 5))
        next_id += 5
        batch = pa.table({"id": keys, "name": [f"u{c}"] * 10, "amount": [float(c)] * 10}, schema=SCHEMA)
        for t in tables:
            t.upsert(batch)


def _feeds(t: lineage.Table, ids: bool = True) -> dict:
    """Feeds ending at the current version from a few starts, net and not, and the deleted rows, without timestamps
    (and without row ids unless ``ids``)."""

    def strip(tbl: pa.Table) -> list[tuple]:
        return rows(tbl, [c for c in tbl.column_names if not c.endswith("_timestamp") and (ids or c != "_row_id")])

    out: dict = {}
    for a in (0, 1, t.version // 2, t.version - 1):
        out[(a, False)] = strip(cdf.changes(t, a, t.version))
        out[(a, True)] = strip(cdf.changes(t, a, t.version, net=True))
    for v in range(2, t.version + 1):  # commit by commit
        out[v] = strip(cdf.changes(t, v - 1, v))
    out["deleted"] = strip(cdf.deleted_rows(t, 1))
    return out


def _files(t: lineage.Table) -> tuple[int, int]:
    """(live data files, live delete files)."""
    t.refresh()
    content = t.iceberg.inspect.files().column("content").to_pylist()
    return sum(1 for c in content if c == 0), sum(1 for c in content if c != 0)


@pytest.mark.parametrize("format_version", [2, 3])
def test_small_commits_keep_few_files_and_the_same_feed(warehouse: str, format_version: int) -> None:
    props = {"format-version": str(format_version), "lineage.cdf.retention.versions": "1000"}
    t = lineage.create_table("db.small", SCHEMA, key=["id"], warehouse=warehouse, properties=props)
    plain = lineage.create_table("db.plain", SCHEMA, key=["id"], warehouse=warehouse, properties={**props, **OFF})
    for x in (t, plain):
        x.append(_base())
    _stream([t, plain], 45)

    data, deletes = _files(t)
    plain_data, plain_deletes = _files(plain)
    # 30 upserts: a file each without folding; folded, a logarithmic number of tiers of at most min-files (8) files
    assert plain_data == 31 and data <= 14, (data, plain_data)
    assert deletes <= data, "at most one delete file per data file"
    if format_version == 2:
        assert plain_deletes >= 40, plain_deletes  # one per commit and data file deleted from
    # same rows, row ids and versions; on v3 a folded file's rows count as added rows of the snapshot, so the row ids
    # of later inserts differ from the plain table's (each row keeps its own, checked below)
    ids = format_version == 2
    lineage_columns = [c for c in t.scan(with_lineage=True).column_names if ids or c != "_row_id"]
    assert rows(t.scan(with_lineage=True), lineage_columns) == rows(plain.scan(with_lineage=True), lineage_columns)
    base_ids = {r["id"]: r["_row_id"] for r in t.scan(columns=["id", "_row_id"]).to_pylist() if r["id"] < BASE}
    assert base_ids == {r["id"]: r["_row_id"] for r in plain.scan(columns=["id", "_row_id"]).to_pylist() if r["id"] < BASE}
    fresh = lineage.open_table("db.small", warehouse=warehouse)  # planned from the manifests, not carried by the writer
    assert rows(fresh.scan(with_lineage=True)) == rows(t.scan(with_lineage=True))
    before = _feeds(t)
    assert _feeds(t, ids) == _feeds(plain, ids)
    assert_interop(t)

    # the snapshots that held the replaced delete files (and folded data files) go: the feed stays as it was
    t.expire_snapshots(retain_last=1)
    t.vacuum(older_than=ZERO)
    deleted_rows._CACHE.clear()
    deleted_rows._VALUE_CACHE.clear()
    assert _feeds(t) == before
    assert_interop(t)


def test_a_write_with_a_users_expression_folds_the_small_files_it_does_not_touch(warehouse: str) -> None:
    """An update's DuckDB database is sealed to the files it plans on; the fold reads the others all the same."""
    t = lineage.create_table("db.t", SCHEMA, key=["id"], warehouse=warehouse, properties={"lineage.write.fold.min-files": "2"})
    t.append(_base())
    for start in (5000, 6000):
        t.append(pa.table({"id": list(range(start, start + 10)), "name": ["n"] * 10, "amount": [1.0] * 10}, schema=SCHEMA))
    before = {r["id"]: r["_row_id"] for r in t.scan(columns=["id", "_row_id"]).to_pylist()}
    info = t.update("id < 10", {"amount": "amount + 1"})
    assert info.data_files_removed == 2 and _files(t)[0] == 2  # the base; the update's new images with the small files folded
    assert sorted(r["id"] for r in cdf.changes(t, info.version - 1, info.version).to_pylist()) == sorted(list(range(10)) * 2)
    assert {r["id"]: r["_row_id"] for r in t.scan(columns=["id", "_row_id"]).to_pylist()} == before


@pytest.mark.parametrize("format_version", [2, 3])
def test_a_fold_writes_the_manifests_it_rewrites_as_one(warehouse: str, format_version: int) -> None:
    """Each small commit adds a data manifest of its own (merged only past min-count-to-merge); a fold removing their
    files rewrites them as one manifest per content, not one each: one object for them on a store."""
    t = lineage.create_table("db.t", SCHEMA, key=["id"], warehouse=warehouse, properties={"format-version": str(format_version)})
    t.append(_base())
    for start in range(5000, 5080, 10):  # eight small files, each in a manifest of its own
        t.append(pa.table({"id": list(range(start, start + 10)), "name": ["n"] * 10, "amount": [1.0] * 10}, schema=SCHEMA))
    before = rows(t.scan(with_lineage=True).sort_by("id"))
    t.iceberg.refresh()
    manifests_before = len(t.iceberg.current_snapshot().manifests(t.iceberg.io))
    ids = [1, 2, 3, 4, 5, 9000, 9001, 9002, 9003, 9004]  # 5 updates, 5 inserts: 10 rows written, as each small file holds
    info = t.upsert(pa.table({"id": ids, "name": ["u"] * 5 + ["i"] * 5, "amount": [2.0] * 10}, schema=SCHEMA))
    assert info.data_files_removed == 8, info  # the eight small files folded into the upsert's file
    t.iceberg.refresh()
    snapshot = t.iceberg.current_snapshot()
    written = [m for m in snapshot.manifests(t.iceberg.io) if m.added_snapshot_id == snapshot.snapshot_id]
    data = [m for m in written if m.content == 0]
    # the eight rewritten manifests as one (their files DELETED), the upsert's new file ADDED to it (on v3 as its first
    # entry, inheriting the manifest's first row id: the row ids below stay those of a manifest of its own)
    counts = sorted((m.added_files_count, m.deleted_files_count) for m in data)
    assert counts == [(1, 8)], [(m.manifest_path, m.deleted_files_count) for m in data]
    # base, the one rewritten (and new), deletes
    assert manifests_before == 9 and len(snapshot.manifests(t.iceberg.io)) == 3
    after = {r[0]: r for r in rows(t.scan(with_lineage=True).sort_by("id"))}
    assert [after[i][1:3] for i in ids] == [("u", 2.0)] * 5 + [("i", 2.0)] * 5
    assert [r for r in before if r[0] not in ids] == [r for r in after.values() if r[0] not in ids]  # rows moved, unchanged
    assert_interop(t)


def _delete_paths(t: lineage.Table) -> list[str]:
    t.refresh()
    return [p for p, c in zip(*t.iceberg.inspect.files().select(["file_path", "content"]).to_pydict().values(), strict=True) if c == 1]


def test_a_data_file_keeps_one_delete_file_of_ours_and_the_summary_stays_truthful(warehouse: str) -> None:
    t = lineage.create_table("db.t", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_base())
    t.delete("id IN (1, 2)")
    first = _delete_paths(t)
    t.delete("id IN (3, 4, 5)")
    second = _delete_paths(t)
    assert len(first) == len(second) == 1 and first != second
    snap = t.iceberg.current_snapshot()
    assert snap.summary["added-delete-files"] == "1" and snap.summary["removed-delete-files"] == "1"
    assert snap.summary["total-position-deletes"] == "5" and snap.summary["total-delete-files"] == "1"
    assert sorted(r["id"] for r in cdf.deleted_rows(t, 1).to_pylist()) == [1, 2, 3, 4, 5]
    assert [r["id"] for r in cdf.changes(t, 2, 3).to_pylist()] == [3, 4, 5]
    assert t.scan().num_rows == BASE - 5
    assert_interop(t)


def test_merging_can_be_turned_off_and_a_bad_value_is_refused(warehouse: str) -> None:
    t = lineage.create_table("db.t", SCHEMA, key=["id"], warehouse=warehouse, properties={"lineage.write.delete.merge": "false"})
    t.append(_base())
    t.delete("id = 1")
    t.delete("id = 2")
    assert len(_delete_paths(t)) == 2
    bad = lineage.create_table("db.bad", SCHEMA, warehouse=warehouse, properties={"lineage.write.delete.merge": "sometimes"})
    bad.append(_base())
    version = bad.version
    with pytest.raises(InvalidArgumentError, match="lineage.write.delete.merge"):
        bad.delete("id = 1")
    bad.refresh()
    assert bad.version == version and bad.scan().num_rows == BASE


def test_only_file_scoped_delete_files_of_ours_are_replaced(warehouse: str) -> None:
    t = lineage.create_table("db.t", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_base())
    data = t.state().live_files()[0].data_file
    (ours,) = write_position_deletes(t.iceberg, [(data, np.array([0, 1]))])
    assert is_own_file_scoped(ours, data.file_path)
    assert not is_own_file_scoped(ours, data.file_path + ".other")
    spark_named = DataFile.from_args(**{**{k: getattr(ours, k) for k in ("content", "file_format", "partition", "record_count",
                                                                            "file_size_in_bytes", "lower_bounds", "upper_bounds")},
                                        "file_path": os.path.dirname(ours.file_path) + "/00000-5-0b3c-00001-deletes.parquet"})
    assert not is_own_file_scoped(spark_named, data.file_path)
    (scoped,) = write_position_deletes(t.iceberg, [(data, np.array([0])), (data.__class__.from_args(
        content=DataFileContent.DATA, file_path=data.file_path + "x", file_format=data.file_format, partition=data.partition,
        record_count=1, file_size_in_bytes=1), np.array([0]))], "partition")
    assert not is_own_file_scoped(scoped, data.file_path)  # names two data files: partition-scoped


@pytest.mark.reference
def test_spark_reads_a_table_with_replaced_delete_files_and_its_deletes_stay(reference, warehouse: str) -> None:
    """Spark's own position delete file on our data file is not replaced by our next delete from that file."""
    from test_reference_interop import assert_spark_reads_ours

    t = lineage.create_table("shop.orders", SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_base())
    _stream([t], 12)
    assert_spark_reads_ours(reference, warehouse, t)
    reference.sql(warehouse, "DELETE FROM shop.orders WHERE id IN (7, 8)")
    t.refresh()
    spark_deletes = [p for p in _delete_paths(t) if not is_own_file_scoped_path(t, p)]
    assert spark_deletes
    t.delete("id IN (9, 10)")
    assert set(spark_deletes) <= set(_delete_paths(t))
    assert not {7, 8, 9, 10} & {r["id"] for r in t.scan(columns=["id"]).to_pylist()}
    assert_spark_reads_ours(reference, warehouse, t)
    assert_interop(t)


def is_own_file_scoped_path(t: lineage.Table, path: str) -> bool:
    """Whether the live delete file at ``path`` is one of ours scoped to one data file."""
    for f in t.state().live_files():
        for d in f.deletes:
            if d.file_path == path:
                return is_own_file_scoped(d, f.path)
    return False


def test_a_delete_file_past_the_merge_limit_is_kept_and_new_positions_go_apart(warehouse) -> None:
    props = {"lineage.write.delete.merge.max-rows": "5", "lineage.write.fold.max-rows": "0"}
    t = lineage.create_table("db.t", SCHEMA, key=["id"], warehouse=warehouse, properties=props)
    t.append(_base())
    sizes = []
    for c in range(6):  # 3 positions per commit, all in the one data file
        t.delete(f"id IN ({3 * c}, {3 * c + 1}, {3 * c + 2})")
        live = next(iter(t.refresh().state().files().files.values()))
        sizes.append(sorted(d.record_count for d in live.deletes))
    # 3, then 3+3 merged (6 > 5: kept from then on), then new files of their own that merge until past the limit
    assert sizes == [[3], [6], [3, 6], [6, 6], [3, 6, 6], [6, 6, 6]]
    assert sorted(t.scan(columns=["id"]).column("id").to_pylist()) == list(range(18, BASE))
    assert_interop(t)
