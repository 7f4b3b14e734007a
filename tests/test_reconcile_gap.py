"""Gaps and lost files: foreign snapshots expired before this library reconciled them (pyiceberg's expiry, no
Spark needed), and data files the deleted-rows index needs that another engine deleted."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from conftest import SCHEMA, rows

import cdf
import lineage
import lineage.reconcile as rec
from lineage.storage.fileio import local_path
from lineage.maintenance import verify
from lineage.storage.metadata import _LIST_CACHE

FOREIGN = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("amount", pa.float64())])


def _batch(items: list[tuple[int, str, float]], schema: pa.Schema = SCHEMA) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "name": n, "amount": a} for i, n, a in items], schema=schema)


def _ids(t: lineage.Table) -> dict[int, tuple[int, int, int]]:
    out = t.scan().select(["id", "_row_id", "_row_created_at_version", "_row_last_updated_at_version"]).to_pylist()
    return {r["id"]: (r["_row_id"], r["_row_created_at_version"], r["_row_last_updated_at_version"]) for r in out}


def _feed(t: lineage.Table, a: int) -> list[tuple]:
    return sorted((r["id"], r["_change_type"], r["_row_id"]) for r in cdf.changes(t, a).to_pylist())


def _forget() -> None:
    rec._CACHE.clear()
    _LIST_CACHE.clear()


def _expire_all_but_current(t: lineage.Table) -> list[int]:
    """pyiceberg expires every snapshot but the current one before any reader of ours reads it; the expired ids."""
    ice = t.iceberg
    expired = [s.snapshot_id for s in ice.metadata.snapshots if s.snapshot_id != ice.metadata.current_snapshot_id]
    ice.maintenance.expire_snapshots().by_ids(expired).commit()
    ice.refresh()
    assert ice.metadata.current_snapshot().parent_snapshot_id is None  # pyiceberg clears the survivor's parent
    _forget()
    t.refresh()
    return expired


def _foreign_history(t: lineage.Table) -> tuple[list[int], str]:
    """v1 ours (1, 2, 3); v2 foreign append 4; v3 foreign copy-on-write delete of 2 (the file of 1..3 rewritten);
    v4 foreign update of 4 (delete + append); then v1..v3 expired by pyiceberg before any reader reconciled them.
    Returns the expired snapshot ids and the data file v1 wrote."""
    t.append(_batch([(1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0)]))
    first_file = next(iter(t.state().files().files))
    ice = t.iceberg
    ice.append(_batch([(4, "d", 4.0)], FOREIGN))
    ice.refresh()
    ice.delete("id = 2")
    ice.refresh()
    ice.append(_batch([(5, "e", 5.0)], FOREIGN))
    ice.refresh()
    expired = _expire_all_but_current(t)
    return expired, first_file


def test_gap_is_reconciled_as_one_step(table):
    t = table
    _, _ = _foreign_history(t)
    before = {1: None}
    ids = _ids(t)
    assert sorted(ids) == [1, 3, 4, 5]
    assert rows(t.scan(with_lineage=False)) == rows(_batch([(1, "a", 1.0), (3, "c", 3.0), (4, "d", 4.0), (5, "e", 5.0)]))
    # 1 and 3 were moved by the copy-on-write delete: row ids 0 and 2 and their versions kept; 4 and 5 are new
    assert ids[1] == (0, 1, 1) and ids[3] == (2, 1, 1) and before
    assert ids[4][1:] == (4, 4) and ids[5][1:] == (4, 4) and {ids[4][0], ids[5][0]} == {3, 4}
    h = t.history()
    assert [c.version for c in h] == [1, 4] and not h[0].gap
    assert h[-1].gap and h[-1].foreign == "unknown" and (h[-1].inserted, h[-1].updated, h[-1].deleted) == (2, 0, 1)
    with pytest.raises(lineage.HistoryGapError, match=r"after version 1 up to version 4.*from_version >= 4"):
        cdf.changes(t, 1)
    with pytest.raises(lineage.HistoryGapError):
        cdf.changes(t, 0, 4)
    assert cdf.changes(t, 4).num_rows == 0
    report = verify(t)
    assert not report.problems and any("gap at version 4" in n for n in report.notes)

    # The lineage is persisted: another process reads the same ids; our next write and a feed after the gap work.
    _forget()
    assert _ids(lineage.open_table("shop.orders", warehouse=t.iceberg.metadata.location.rsplit("/shop", 1)[0])) == ids
    t.upsert(_batch([(3, "c2", 30.0), (6, "f", 6.0)]))
    assert _feed(t, 4) == [(3, "update_postimage", 2), (3, "update_preimage", 2), (6, "insert", 5)]
    with pytest.raises(lineage.HistoryGapError):
        cdf.changes(t, 2, 5)
    assert not verify(t).problems


def test_one_foreign_commit_whose_parent_expired_is_not_a_gap(table):
    """Our version 1 was read; one foreign commit lands and its parent (version 1) is expired before we read it:
    nothing unread was lost, so the commit is reconciled as itself, with its feed, not as a gap."""
    t = table
    t.append(_batch([(1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0)]))
    assert t.version == 1
    ice = t.iceberg
    ice.delete("id = 2")  # foreign copy-on-write: 1 and 3 move to a new file, 2 is deleted
    ice.refresh()
    _expire_all_but_current(t)
    h = t.history()
    assert [c.version for c in h] == [1, 2] and not h[-1].gap
    assert (h[-1].inserted, h[-1].updated, h[-1].deleted) == (0, 0, 1)
    assert _feed(t, 1) == [(2, "delete", 1)]
    assert _ids(t) == {1: (0, 1, 1), 3: (2, 1, 1)}  # the moved rows keep their ids and versions
    assert not verify(t).problems


def test_gap_whose_removed_files_are_gone(table):
    """Spark's expire_snapshots also deletes the files only expired snapshots used: the removed images of the gap
    cannot be read, so rows that moved get new row ids; verify reports the lost file; later feeds work."""
    t = table
    _, first_file = _foreign_history(t)
    os.remove(local_path(first_file))
    ids = _ids(t)
    assert sorted(ids) == [1, 3, 4, 5] and len({v[0] for v in ids.values()}) == 4 and min(v[0] for v in ids.values()) >= 3
    h = t.history()[-1]
    assert h.gap and (h.inserted, h.deleted) == (4, 3)
    report = verify(t)
    assert any("data file lost" in p and first_file in p and "version 4" in p for p in report.problems)
    t.append(_batch([(7, "g", 7.0)]))
    assert [r[1] for r in _feed(t, 4)] == ["insert"]


def test_feed_over_a_lost_file_raises(table):
    """A data file the deleted-rows index points at is deleted behind our back: the feed over the versions whose
    removed images it holds raises LostFileError naming it; verify reports it; ranges after them still work."""
    t = table
    t.append(_batch([(1, "a", 1.0), (2, "b", 2.0)]))
    path = next(iter(t.state().files().files))
    t.iceberg.delete("id = 2")  # foreign copy-on-write: the file leaves the snapshot, the index points into it
    t.refresh()
    t.append(_batch([(3, "c", 3.0)]))
    assert [r[1] for r in _feed(t, 1)] == ["delete", "insert"]
    os.remove(local_path(path))
    with pytest.raises(lineage.LostFileError, match=r"version\(s\) 2 from data file .*" + os.path.basename(path)):
        cdf.changes(t, 1)
    with pytest.raises(lineage.LostFileError):
        cdf.deleted_rows(t, 0)
    assert _feed(t, 2) == [(3, "insert", 2)]
    problems = verify(t).problems
    assert len(problems) == 1 and "data file lost" in problems[0] and "version 2" in problems[0]


def test_ranges_before_and_inside_a_gap(table):
    t = table
    _foreign_history(t)
    assert cdf.changes(t, 0, 1).num_rows == 3  # before the gap: our own version 1
    with pytest.raises(lineage.HistoryGapError, match=r"from_version=2 lies in a gap.*from_version >= 4"):
        cdf.changes(t, 2)
    with pytest.raises(lineage.HistoryGapError):
        cdf.changes(t, 0, 3)


def test_gap_on_a_keyless_table(warehouse):
    """Without a key, identical rows pair across the gap as moves (row ids kept); the rest are deletes and inserts."""
    t = lineage.create_table("shop.events", SCHEMA, warehouse=warehouse)
    t.append(_batch([(1, "a", 1.0), (1, "a", 1.0), (2, "b", 2.0)]))
    before = sorted(r["_row_id"] for r in t.scan().to_pylist() if r["id"] == 1)
    ice = t.iceberg
    ice.delete("id = 2")  # rewrites the file: the two identical rows move
    ice.refresh()
    ice.append(_batch([(3, "c", 3.0)]))
    ice.refresh()
    ice.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in ice.metadata.snapshots if s.snapshot_id != ice.metadata.current_snapshot_id]).commit()
    _forget()
    t.refresh()
    got = t.scan().to_pylist()
    assert sorted(r["_row_id"] for r in got if r["id"] == 1) == before
    h = t.history()[-1]
    assert h.gap and (h.inserted, h.updated, h.deleted) == (1, 0, 1)
    assert not verify(t).problems
