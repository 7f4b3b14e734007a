"""Reads reconcile in memory; writes persist (DESIGN section 8, lineage.reconcile).

A reader of a table with foreign commits writes nothing under the table's location, so it works without write
permission there: scan, as_of, history, the change feed (DuckDB and Spark engines), deleted_rows and verify.
The first write of ours (or ``Table.reconcile()``) persists the reconciled lineage under the table's location;
the list it commits names no file of the reader's scratch directory, and a fresh process finds the persisted
lists. The scratch directory is removed when the process exits.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
from collections.abc import Iterator

import pyarrow as pa
import pytest
from conftest import SCHEMA, rows

import cdf
import lineage
import lineage.reconcile as rec
from lineage.storage.fileio import local_path
from lineage.maintenance import verify
from lineage.storage.metadata import _LIST_CACHE, segment_object
from lineage.reconcile import reconciled_list_path
from lineage.reconcile.scratch import is_scratch, scratch_location
from lineage.state import forget_planned_files

NAME = "shop.orders"
FOREIGN = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("amount", pa.float64())])


def _batch(items: list[tuple[int, str, float]], schema: pa.Schema = SCHEMA) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "name": n, "amount": a} for i, n, a in items], schema=schema)


def _listing(root: str) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time."""
    out = {}
    for folder, _, names in os.walk(root):
        for n in names:
            st = os.stat(os.path.join(folder, n))
            out[os.path.join(folder, n)] = (st.st_size, st.st_mtime_ns)
    return out


@contextlib.contextmanager
def _read_only(root: str) -> Iterator[None]:
    """Take write permission on every folder under ``root`` away (restored after); the listing must not change.

    The permission check binds an unprivileged user; the listing check binds everyone, root included.
    """
    before = _listing(root)
    folders = [f for f, _, _ in os.walk(root)]
    for f in folders:
        os.chmod(f, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    try:
        yield
    finally:
        for f in folders:
            os.chmod(f, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    assert _listing(root) == before, "a read wrote under the table's location"


def _fresh_process_memory() -> None:
    """Forget what this process derived or read, as a new process would."""
    rec._CACHE.clear()
    _LIST_CACHE.clear()
    forget_planned_files()


def _names_no_scratch(t: lineage.Table) -> None:
    """The current lineage list names no scratch file, directly or through its commit log."""
    lst = t.state().lineage
    named = list(lst.segments) + list(lst.resolved_deletes or ()) + list(lst.key_index or ())
    for c in lst.log.entries():
        named += [p for p in (c.segment, c.index) if p]
    named += list(lst.log.chunk_paths(stop=lambda p: False))
    assert named and not [p for p in named if is_scratch(p) or p.startswith(scratch_location(t.iceberg))]
    assert all(os.path.exists(local_path(segment_object(p))) for p in named)  # a segment inside a list: that list


def _reads(t: lineage.Table, v0: int) -> tuple:
    """Everything a reader asks, as comparable values."""
    versions = [h.version for h in t.history()]
    return (
        rows(t.scan()),
        [rows(t.scan(as_of=v)) for v in versions],
        [(h.version, h.operation, h.foreign, h.inserted, h.updated, h.deleted) for h in t.history()],
        rows(cdf.changes(t, v0)),
        rows(cdf.changes(t, v0, net=True)),
        [rows(cdf.changes(t, v - 1, v)) for v in versions if v > v0],
        rows(cdf.deleted_rows(t)),
        verify(t).problems,
    )


def test_pyiceberg_commits_read_without_writing_then_persisted(table, warehouse):
    """pyiceberg commits: every read works on a read-only table directory and writes nothing there; the scratch
    copies are gone after the reading process exits; Table.reconcile() persists; a fresh process reads the
    persisted lists and writes nothing either."""
    t = table
    t.append(_batch([(1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0)]))
    v0 = t.version
    t.iceberg.append(_batch([(4, "d", 4.0), (5, "e", 5.0)], FOREIGN))
    t.iceberg.refresh()
    t.iceberg.delete("id = 2")
    t.iceberg.refresh()
    t.iceberg.overwrite(_batch([(3, "c2", 30.0)], FOREIGN), overwrite_filter="id = 3")
    root = local_path(t.iceberg.metadata.location)
    foreign = [s for s in t.iceberg.metadata.snapshots if "lineage.list" not in s.summary.additional_properties]
    assert len(foreign) >= 3

    reader = lineage.open_table(NAME, warehouse=warehouse)
    with _read_only(root):
        seen = _reads(reader, v0)
    assert rows(reader.scan(with_lineage=False)) == rows(_batch([(1, "a", 1.0), (3, "c2", 30.0), (4, "d", 4.0), (5, "e", 5.0)]))
    assert [h.foreign for h in reader.history()][1:] == ["unknown"] * (len(reader.history()) - 1)
    assert not seen[-1]
    assert not any(os.path.exists(reconciled_list_path(t.iceberg, s.snapshot_id)) for s in foreign)

    # Another process reads too, without writing; its scratch directory is gone when it exits.
    code = (
        "import sys, lineage\n"
        "from lineage.reconcile.scratch import scratch_root\n"
        f"t = lineage.open_table({NAME!r}, warehouse=sys.argv[1])\n"
        "print(scratch_root()); print(t.scan().num_rows)\n"
    )
    with _read_only(root):
        out = subprocess.run([sys.executable, "-c", code, warehouse], capture_output=True, text=True, timeout=300, check=True)
    scratch, count = out.stdout.split()
    assert int(count) == 4 and not os.path.exists(scratch)

    # An explicit reconcile persists every foreign snapshot; a fresh process finds them and writes nothing.
    assert reader.reconcile() == [s.sequence_number for s in foreign]
    assert all(os.path.exists(reconciled_list_path(t.iceberg, s.snapshot_id)) for s in foreign)
    _names_no_scratch(reader)
    _fresh_process_memory()
    again = lineage.open_table(NAME, warehouse=warehouse)
    with _read_only(root):
        assert _reads(again, v0) == seen
    _names_no_scratch(again)


@pytest.mark.reference
def test_spark_commits_read_without_writing_then_our_write_persists(reference, warehouse, spark):
    """Spark DELETE and UPDATE (merge-on-read): the reads, the Spark feed engine included, write nothing under the
    table's location; our next write persists the reconciled lineage before committing on top of it, names no
    scratch file, and a fresh process reads the same answers from the persisted lists."""
    t = lineage.create_table(NAME, SCHEMA, key=["id"], warehouse=warehouse)
    t.append(_batch([(1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0), (4, "d", 4.0)]))
    v0 = t.version
    reference.sql(warehouse, f"ALTER TABLE {NAME} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read')")
    reference.sql(warehouse, f"DELETE FROM {NAME} WHERE id = 2")
    reference.sql(warehouse, f"UPDATE {NAME} SET amount = 30.0 WHERE id = 3")
    t.refresh()
    root = local_path(t.iceberg.metadata.location)
    foreign = [s for s in t.iceberg.metadata.snapshots if "lineage.list" not in s.summary.additional_properties]

    with _read_only(root):
        seen = _reads(t, v0)
        sfeed = cdf.changes(t, v0, engine="spark", spark=spark).toPandas()
        sdel = cdf.deleted_rows(t, engine="spark", spark=spark).toPandas()
    key = ["id", "_change_type", "_commit_version", "_row_id"]
    assert sorted(map(tuple, sfeed[key].values.tolist())) == sorted(tuple(r[k] for k in key) for r in cdf.changes(t, v0).to_pylist())
    assert sorted(sdel["id"].tolist()) == [2]
    assert sorted((r["id"], r["_change_type"]) for r in cdf.changes(t, v0).to_pylist()) == [
        (2, "delete"), (3, "update_postimage"), (3, "update_preimage")
    ]
    assert not seen[-1]
    assert not any(os.path.exists(reconciled_list_path(t.iceberg, s.snapshot_id)) for s in foreign)

    rid3 = {r["id"]: r["_row_id"] for r in t.scan().to_pylist()}[3]
    t.upsert(_batch([(3, "c3", 33.0), (5, "e", 5.0)]))  # on top of the reader's in-memory lineage: persisted first
    assert all(os.path.exists(reconciled_list_path(t.iceberg, s.snapshot_id)) for s in foreign)
    _names_no_scratch(t)
    assert {r["id"]: r["_row_id"] for r in t.scan().to_pylist()}[3] == rid3
    after = _reads(t, v0)
    assert not after[-1]
    _fresh_process_memory()
    again = lineage.open_table(NAME, warehouse=warehouse)
    with _read_only(root):
        assert _reads(again, v0) == after
    reference.forget(warehouse)
