"""Upgrading a v2 lineage table to Iceberg v3: every v3 reader then returns our row ids, and nothing else changes."""

from __future__ import annotations

import pyarrow as pa
import pytest
from conftest import rows
from test_iceberg_v3_write import SCHEMA, _batch, _metadata_json, assert_readers_agree, ours

import cdf
import lineage
from lineage.errors import InvalidArgumentError

MODES = ["merge-on-read", "copy-on-write"]


def _v2(warehouse: str, mode: str) -> lineage.Table:
    props = {p: mode for p in ("write.delete.mode", "write.update.mode", "write.merge.mode")}
    return lineage.create_table("shop.items", SCHEMA, key=["id"], warehouse=warehouse, properties=props)


def _history(t: lineage.Table) -> None:
    t.append(_batch([1, 2, 3, 4, 5]))
    t.append(_batch([10, 11, 12]))
    t.update("id = 2", {"qty": "7"})
    t.delete("id IN (4, 11)")
    t.upsert(pa.concat_tables([_batch([1, 12], qty=9), _batch([20, 21], qty=4)]))
    t.append(_batch([30, 31]))
    t.compact()
    t.delete("id = 30")
    t.update("id = 5", {"name": "'five'"}, mode="copy-on-write")
    t.append(_batch([60, 61, 62, 63]))
    t.delete("id = 61")  # merge-on-read: a v2 position delete file on a file the upgrade keeps


def _feed(t: lineage.Table, a: int, b: int) -> list[tuple]:
    got = cdf.changes(t, a, b)
    return sorted(rows(got, ["_row_id", "_change_type", "_commit_version", "id", "name", "qty"]))


def _deleted(t: lineage.Table) -> list[tuple]:
    return sorted(rows(cdf.deleted_rows(t, 0), ["_row_id", "_row_deleted_at_version", "id"]))


@pytest.mark.parametrize("mode", MODES)
def test_upgrade_keeps_row_ids_feed_and_deleted_rows(warehouse, mode):
    t = _v2(warehouse, mode)
    _history(t)
    v = t.version
    before, feed, gone = ours(t), _feed(t, 0, v), _deleted(t)
    changes_before = {k: _feed(t, k - 1, k) for k in range(1, v + 1)}

    result = t.upgrade(format_version=3)
    assert result.version == v + 1 and t.iceberg.metadata.format_version == 3
    assert _metadata_json(t)["format-version"] == 3
    assert ours(t) == before  # our ids and updated versions did not move
    assert assert_readers_agree(t) == before  # DuckDB's native _row_id and sequence number are ours
    assert _feed(t, 0, t.version) == feed and _feed(t, v, t.version) == []  # the upgrade is no change
    assert {k: _feed(t, k - 1, k) for k in range(1, v + 1)} == changes_before
    assert _deleted(t) == gone

    # later writes keep working, and the readers keep agreeing
    t.append(_batch([40, 41]))
    t.update("id IN (1, 40)", {"qty": "5"})
    t.delete("id IN (3, 31, 62)")  # 62: the new vector holds the v2 delete of 61 too
    t.upsert(_batch([2, 50], qty=6))
    after = assert_readers_agree(t)
    ids = {r[0]: r[1] for r in after}
    assert {k: ids[k] for k in (1, 2, 5, 10)} == {r[0]: r[1] for r in before if r[0] in (1, 2, 5, 10)}
    assert len(set(ids.values())) == len(ids)
    t.compact()
    assert assert_readers_agree(t) == after
    assert _feed(t, 0, v) == feed


def test_upgrade_of_v3_table_is_a_no_op_and_other_versions_are_refused(warehouse):
    t = _v2(warehouse, "merge-on-read")
    t.append(_batch([1, 2]))
    with pytest.raises(InvalidArgumentError, match="format version 3 only"):
        t.upgrade(format_version=4)
    with pytest.raises(InvalidArgumentError):
        t.upgrade(format_version=2)
    assert t.iceberg.metadata.format_version == 2
    assert t.upgrade().version == 2
    location = t.iceberg.metadata_location
    again = t.upgrade(format_version=3)
    assert again.version is None and "nothing to upgrade" in again.detail
    t.refresh()
    assert t.iceberg.metadata_location == location
    assert assert_readers_agree(t) == [(1, 0, 1), (2, 1, 1)]


def test_upgrade_of_an_empty_table(warehouse):
    t = _v2(warehouse, "merge-on-read")
    assert t.upgrade().version is None
    assert t.iceberg.metadata.format_version == 3
    t.append(_batch([1, 2]))
    assert assert_readers_agree(t) == [(1, 0, 1), (2, 1, 1)]


def test_upgrade_after_a_reconciled_foreign_commit(warehouse):
    t = _v2(warehouse, "merge-on-read")
    t.append(_batch([1, 2, 3]))
    t.iceberg.append(_batch([7, 8]))  # another writer (pyiceberg), reconciled before the upgrade
    t.refresh()
    t.update("id = 7", {"qty": "3"})
    before = ours(t)
    t.upgrade()
    assert assert_readers_agree(t) == before


@pytest.mark.reference
def test_spark_reads_our_row_ids_after_the_upgrade_and_continues_them(reference, warehouse):
    from test_iceberg_v3_write import spark_native

    t = _v2(warehouse, "merge-on-read")
    _history(t)
    before = ours(t)
    t.upgrade()
    assert spark_native(reference, warehouse, t) == assert_readers_agree(t) == before
    next_id = t.iceberg.metadata.next_row_id
    reference.sql(warehouse, f"INSERT INTO {t.name} VALUES (500, 'x', 1)")
    reference.sql(warehouse, f"UPDATE {t.name} SET qty = 99 WHERE id IN (1, 10)")
    theirs = {r[0]: r[1] for r in spark_native(reference, warehouse, t)}
    assert theirs[500] == next_id and {k: theirs[k] for k in (1, 10)} == {r[0]: r[1] for r in before if r[0] in (1, 10)}
    t.refresh()
    t.delete("id = 500")
    t.update("id = 2", {"qty": "1"})
    assert spark_native(reference, warehouse, t) == assert_readers_agree(t)
    reference.forget(warehouse)


def test_cli_upgrade(warehouse):
    import json

    from test_cli import fails, ok, run

    t = _v2(warehouse, "merge-on-read")
    t.append(_batch([1, 2]))
    t.update("id = 2", {"qty": "5"})
    before = ours(t)
    fails(run("--warehouse", warehouse, "upgrade", t.name, "--format-version", "4"), 2, "format version 3 only")
    done = ok(run("--warehouse", warehouse, "upgrade", t.name, "--format-version", "3"))
    assert done.stdout.startswith(f"{t.name}: upgrade: committed version 3")
    again = json.loads(ok(run("--warehouse", warehouse, "-f", "json", "upgrade", t.name)).stdout)
    assert not again["committed"] and "nothing to upgrade" in again["detail"]
    assert assert_readers_agree(t.refresh()) == before


def test_a_failed_upgrade_leaves_the_table_as_it_was(warehouse, monkeypatch):
    from pyiceberg.exceptions import CommitFailedException

    import lineage.catalog
    from lineage.errors import CommitConflictError

    t = _v2(warehouse, "merge-on-read")
    t.append(_batch([1, 2, 3]))
    t.update("id = 2", {"qty": "5"})
    before, location = ours(t), t.iceberg.metadata_location

    def lost(*args, **kwargs):
        raise CommitFailedException("another writer committed first")

    monkeypatch.setattr(lineage.catalog, "swap_metadata", lost)  # the catalog's compare-and-swap
    with pytest.raises(CommitConflictError):
        t.upgrade()
    monkeypatch.undo()
    t.refresh()
    assert t.iceberg.metadata_location == location and t.iceberg.metadata.format_version == 2
    assert ours(t) == before
    t.upgrade()
    assert assert_readers_agree(t) == before


def test_upgrade_of_a_partitioned_table_with_partition_scoped_deletes(warehouse):
    t = lineage.create_table("shop.parts", SCHEMA, key=["id"], partition_by=["bucket(3, id)"], warehouse=warehouse,
                             properties={"write.delete.granularity": "partition"})
    t.append(_batch(list(range(30))))
    t.delete("id IN (1, 2, 3, 4)")
    t.update("id IN (5, 6, 7)", {"qty": "8"})
    before, feed = ours(t), _feed(t, 0, t.version)
    t.upgrade()
    assert assert_readers_agree(t) == before and _feed(t, 0, t.version) == feed
    t.delete("id IN (8, 9)")
    t.update("id IN (5, 10)", {"qty": "2"})
    assert_readers_agree(t)


def _equality_table(warehouse: str) -> lineage.Table:
    """A v2 table whose change-stream commits left equality delete files (the equality strategy)."""
    from test_iceberg_v3_write import _events

    props = {"write.changelog.strategy": "equality", "write.delete.mode": "merge-on-read"}
    t = lineage.create_table("shop.items", SCHEMA, key=["id"], warehouse=warehouse, properties=props)
    t.append(_batch([1, 2, 3, 4, 5]))
    t.apply_changelog(_events(("+U", 1, 9), ("-D", 2, 0), ("+I", 6, 1), ("+I", 7, 1), ("-D", 7, 0)), upsert=True)
    t.delete("id = 5")
    t.apply_changelog(_events(("+U", 3, 8), ("-D", 6, 0)), upsert=True)
    return t


def _live_contents(t: lineage.Table) -> set:
    from lineage.iceberg.planning import live_entries

    t.refresh()
    snap = t.iceberg.metadata.current_snapshot()
    return {e.data_file.content for e in live_entries(t.iceberg, snap.manifests(t.iceberg.io))}


def test_upgrade_converts_equality_deletes_first(warehouse):
    """Equality delete files are converted (a commit of its own) and the table upgraded: no answer changes."""
    from pyiceberg.manifest import DataFileContent

    t = _equality_table(warehouse)
    assert DataFileContent.EQUALITY_DELETES in _live_contents(t)
    v = t.version
    before, feed, gone = ours(t), _feed(t, 0, v), _deleted(t)
    changes_before = {k: _feed(t, k - 1, k) for k in range(1, v + 1)}

    result = t.upgrade()
    assert "2 equality delete file(s) converted" in result.detail
    assert result.version == v + 2 and t.iceberg.metadata.format_version == 3
    assert [c.operation for c in t.history()][-2:] == ["convert-deletes", "upgrade"]
    assert DataFileContent.EQUALITY_DELETES not in _live_contents(t)
    assert ours(t) == before and assert_readers_agree(t) == before
    assert _feed(t, 0, t.version) == feed and _feed(t, v, t.version) == []
    assert {k: _feed(t, k - 1, k) for k in range(1, v + 1)} == changes_before
    assert _deleted(t) == gone
    t.delete("id = 4")  # the first v3 delete merges the converted position deletes into a deletion vector
    assert {r[0] for r in assert_readers_agree(t)} == {1, 3}


def test_upgrade_without_converting_names_the_command_and_leaves_the_table(warehouse):
    from lineage.errors import UnsupportedFormatError

    t = _equality_table(warehouse)
    location, before = t.iceberg.metadata_location, ours(t)
    with pytest.raises(UnsupportedFormatError, match="lineage convert-deletes shop.items"):
        t.upgrade(convert_deletes=False)
    t.refresh()
    assert t.iceberg.metadata_location == location and t.iceberg.metadata.format_version == 2 and ours(t) == before
    t.convert_equality_deletes()
    assert "converted" not in t.upgrade(convert_deletes=False).detail
    assert assert_readers_agree(t) == before
