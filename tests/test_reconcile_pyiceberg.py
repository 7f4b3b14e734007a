"""Foreign commits by pyiceberg itself (no Spark needed): append, delete (copy-on-write rewrite), overwrite and
upsert through pyiceberg's own Table API on a lineage table are reconciled: scans, row ids, history, the change
feed, verify and our next write."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
from conftest import SCHEMA, assert_interop, rows

import cdf
import lineage
from lineage.maintenance import verify


FOREIGN = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("amount", pa.float64())])


def _batch(items: list[tuple[int, str, float]], schema: pa.Schema = SCHEMA) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "name": n, "amount": a} for i, n, a in items], schema=schema)


def _theirs(items: list[tuple[int, str, float]]) -> pa.Table:
    """A batch for pyiceberg's own writers (the key column is required)."""
    return _batch(items, FOREIGN)


def _ids(t: lineage.Table) -> dict[int, tuple[int, int, int]]:
    out = t.scan().select(["id", "_row_id", "_row_created_at_version", "_row_last_updated_at_version"]).to_pylist()
    return {r["id"]: (r["_row_id"], r["_row_created_at_version"], r["_row_last_updated_at_version"]) for r in out}


def _feed(t: lineage.Table, a: int, net: bool = False) -> list[tuple]:
    return sorted((r["id"], r["_change_type"], r["_row_id"]) for r in cdf.changes(t, a, net=net).to_pylist())


def test_pyiceberg_writes_are_reconciled(table):
    t = table
    t.append(_batch([(1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0)]))
    base = _ids(t)
    ice = t.iceberg

    ice.append(_theirs([(4, "d", 4.0)]))  # v2: a foreign append
    t.refresh()
    now = _ids(t)
    assert {k: now[k] for k in base} == base and now[4][1:] == (2, 2) and now[4][0] == 3
    h = t.history()[-1]
    assert h.foreign == "unknown" and h.operation == "append" and h.inserted == 1
    assert _feed(t, 1) == [(4, "insert", 3)]

    t.iceberg.refresh()
    t.iceberg.delete("id = 2")  # v3: pyiceberg rewrites the file copy-on-write: moves for 1 and 3, a delete
    t.refresh()
    now = _ids(t)
    assert sorted(now) == [1, 3, 4] and now[1] == base[1] and now[3] == base[3]
    assert _feed(t, 2) == [(2, "delete", base[2][0])]

    t.iceberg.refresh()
    v_before = t.version
    # pyiceberg's upsert commits several snapshots in one transaction (an overwrite that deletes the matched
    # keys, then appends); each is reconciled on its own, so key 3 is deleted and inserted again with a new row id.
    t.iceberg.upsert(_theirs([(3, "c2", 30.0), (5, "e", 5.0)]))
    t.refresh()
    v = t.version
    assert v >= v_before + 2
    now = _ids(t)
    assert v_before < now[3][1] == now[3][2] <= v and now[3][0] not in {r[0] for r in base.values()}
    assert _feed(t, v_before, net=True) == sorted([(3, "delete", base[3][0]), (3, "insert", now[3][0]), (5, "insert", now[5][0])])
    assert not verify(t).problems
    assert_interop(t)

    # Our writes on top, then a pyiceberg overwrite of everything: a delete snapshot and an append snapshot, so
    # every old row is deleted and the new ones are inserted (key 1 too: it is in neither snapshot twice).
    t.upsert(_batch([(1, "a2", 10.0)]))
    t.delete("id = 4")
    t.iceberg.refresh()
    v0 = t.version
    t.iceberg.overwrite(_theirs([(1, "a3", 100.0), (6, "f", 6.0)]))
    t.refresh()
    now = _ids(t)
    assert sorted(now) == [1, 6] and now[1][0] != base[1][0]
    assert sorted({(k, c) for k, c, _ in _feed(t, v0)}) == [(1, "delete"), (1, "insert"), (3, "delete"), (5, "delete"), (6, "insert")]
    assert [h.foreign for h in t.history()] == [None, *["unknown"] * (v - 1), None, None, *["unknown"] * (t.version - v0)]
    assert not verify(t).problems
    assert_interop(t)
    t.upsert(_batch([(6, "f2", 7.0)]))
    assert rows(t.scan(with_lineage=False)) == rows(_batch([(1, "a3", 100.0), (6, "f2", 7.0)]))
    assert pc.sum(t.scan().column("_row_id")).as_py() is not None


def test_reconcile_is_idempotent_and_persisted(table, warehouse):
    t = table
    t.append(_batch([(1, "a", 1.0)]))
    t.iceberg.append(_theirs([(2, "b", 2.0)]))
    assert t.reconcile() == [2]
    first = _ids(t)
    import lineage.reconcile as rec

    rec._CACHE.clear()  # a fresh process: the persisted list is read back, not derived again
    path = rec.reconciled_list_path(t.iceberg, t.iceberg.metadata.current_snapshot().snapshot_id)
    stamp = os.path.getmtime(path)
    assert _ids(lineage.open_table(t.name, warehouse=warehouse)) == first
    assert t.reconcile() == [2] and os.path.getmtime(path) == stamp
    # The CLI's commit log says which commits another engine made.
    import json
    import subprocess
    import sys

    log = subprocess.run(
        [sys.executable, "-m", "lineage.cli", "--warehouse", warehouse, "-f", "json", "log", t.name],
        capture_output=True, text=True, timeout=300,
    )
    assert log.returncode == 0, log.stderr
    assert [(c["version"], c["writer"]) for c in json.loads(log.stdout)] == [(1, "lineage"), (2, "unknown")]


def test_vacuum_keeps_reconciled_lineage(table):
    """Expiry and vacuum after foreign commits: the reconciled lists, segments and index files of retained
    snapshots stay; scans, the feed and verify still work, in this process and in a fresh one."""
    import datetime as dt

    import lineage.reconcile as rec
    from lineage.storage.metadata import _LIST_CACHE, _SEGMENT_CACHE

    t = table
    t.append(_batch([(1, "a", 1.0), (2, "b", 2.0)]))
    t.iceberg.append(_theirs([(3, "c", 3.0)]))
    t.refresh()
    t.iceberg.delete("id = 1")  # foreign head: no list of ours points at its files
    t.refresh()
    expected = rows(t.scan())
    feed = _feed(t, 0)
    t.expire_snapshots(retain_last=1)  # the foreign head alone: its lineage cannot be derived again
    t.vacuum(older_than=dt.timedelta(0))
    rec._CACHE.clear()
    _LIST_CACHE.clear()
    _SEGMENT_CACHE.clear()
    assert rows(t.scan()) == expected
    assert _feed(t, 0) == feed
    assert not verify(t).problems
    t.upsert(_batch([(2, "b2", 2.5)]))
    assert not verify(t).problems


def test_changelog_and_deleted_rows_after_foreign_commits(table):
    """apply_changelog and deleted_rows on top of foreign commits: the change stream sees the foreign rows
    (an update of a foreign insert keeps its row id) and deleted_rows lists what the foreign delete removed."""
    t = table
    t.append(_batch([(1, "a", 1.0), (2, "b", 2.0)]))
    t.iceberg.append(_theirs([(3, "c", 3.0)]))
    t.iceberg.refresh()
    t.iceberg.delete("id = 1")
    t.refresh()
    gone = cdf.deleted_rows(t).to_pylist()
    assert [(r["id"], r["_row_id"]) for r in gone] == [(1, 0)]
    rid3 = _ids(t)[3][0]
    events = pa.table({"_op": ["+U", "-D"], "id": [3, 2], "name": ["c2", None], "amount": [30.0, None]})
    t.apply_changelog(events, upsert=True)
    now = _ids(t)
    assert sorted(now) == [3] and now[3][0] == rid3
    assert sorted((r["id"], r["_row_id"]) for r in cdf.deleted_rows(t).to_pylist()) == [(1, 0), (2, 1)]  # deleted rows only, not pre-images
    assert not verify(t).problems


def test_foreign_expiry_before_reconciliation(table):
    """A foreign snapshot whose parent (our commit) another engine expired before any reader of ours reconciled the
    foreign one is reconciled as itself, with its feed (one commit, nothing unread lost: no gap; longer chains are
    gaps, tests/test_reconcile_gap.py); without the table's older metadata files, which
    name the expired ancestors, reads raise LineageMetadataError naming what to do (no wrong answer);
    reconciled before the expiry, there is no gap."""
    import pytest

    t = table
    t.append(_batch([(1, "a", 1.0)]))
    t.iceberg.append(_theirs([(2, "b", 2.0)]))
    parent = t.iceberg.metadata.current_snapshot().parent_snapshot_id
    t.iceberg.maintenance.expire_snapshots().by_id(parent).commit()
    t.refresh()
    assert rows(t.scan(with_lineage=False)) == rows(_batch([(1, "a", 1.0), (2, "b", 2.0)]))
    assert not t.history()[-1].gap and t.history()[-1].inserted == 1
    assert [(r["_change_type"], r["id"]) for r in cdf.changes(t, 1, 2).to_pylist()] == [("insert", 2)]

    lost = lineage.create_table("shop.lost", SCHEMA, key=["id"], warehouse=t.iceberg.metadata.location.rsplit("/shop", 1)[0])
    lost.append(_batch([(1, "a", 1.0)]))
    lost.iceberg.append(_theirs([(2, "b", 2.0)]))
    parent = lost.iceberg.metadata.current_snapshot().parent_snapshot_id
    lost.iceberg.maintenance.expire_snapshots().by_id(parent).commit()
    for entry in lost.iceberg.metadata.metadata_log:
        os.remove(entry.metadata_file.removeprefix("file://"))
    lost.refresh()
    with pytest.raises(lineage.LineageMetadataError, match="expired before this library reconciled.*lineage reconcile"):
        lost.scan()
    with pytest.raises(lineage.LineageMetadataError):
        lost.upsert(_batch([(3, "c", 3.0)]))

    # The same history, reconciled before the expiry, stays readable.
    other = lineage.create_table("shop.other", SCHEMA, key=["id"], warehouse=t.iceberg.metadata.location.rsplit("/shop", 1)[0])
    other.append(_batch([(1, "a", 1.0)]))
    other.iceberg.append(_theirs([(2, "b", 2.0)]))
    assert other.reconcile() == [2]
    other.iceberg.refresh()
    parent = other.iceberg.metadata.current_snapshot().parent_snapshot_id
    other.iceberg.maintenance.expire_snapshots().by_id(parent).commit()
    import lineage.reconcile as rec

    rec._CACHE.clear()
    assert rows(other.scan(with_lineage=False)) == rows(_batch([(1, "a", 1.0), (2, "b", 2.0)]))
    assert not other.history()[-1].gap


def _scan_in_process(warehouse: str) -> list[tuple]:
    t = lineage.open_table("shop.orders", warehouse=warehouse)
    return rows(t.scan())


def test_processes_reconciling_at_once_agree(table, warehouse):
    """Three fresh processes meet the same foreign snapshots at once: each reconciles and writes the same files
    (replaced atomically), and all read the same rows with the same row ids as this process."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    t = table
    t.append(_batch([(1, "a", 1.0), (2, "b", 2.0)]))
    t.iceberg.append(_theirs([(3, "c", 3.0), (4, "d", 4.0)]))
    t.iceberg.refresh()
    t.iceberg.delete("id = 1")
    with ProcessPoolExecutor(3, mp_context=mp.get_context("spawn")) as pool:
        seen = list(pool.map(_scan_in_process, [warehouse] * 3))
    t.refresh()
    assert seen == [rows(t.scan())] * 3
    assert not verify(t).problems
